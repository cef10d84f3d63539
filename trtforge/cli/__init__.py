"""Command-line interface (click): one module per command, heavy imports inside the commands."""
