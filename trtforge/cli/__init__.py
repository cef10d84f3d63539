"""Command-line interface (click): one module per command, heavy imports inside the commands.

The top floor: may import every trtforge package; none imports it.
"""
