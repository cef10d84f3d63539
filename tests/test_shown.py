"""`trtforge.errors.shown`: how every error message quotes a value it was given, short whatever its size."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from trtforge.errors import SHOWN_CHARS, shown, shown_name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (-12, "-12"),
        (10**39, "1" + "0" * 39),
        ("abc", "'abc'"),
        ("", "''"),
        (1.5, "1.5"),
        (True, "True"),
        (None, "None"),
        ((1, 2), "(1, 2)"),
        ([1, "a"], "[1, 'a']"),
        ({"a": 1}, "{'a': 1}"),
        (np.int64(7), "7"),
        ("\ud800", "'\\ud800'"),
    ],
)
def test_a_short_value_reads_as_its_repr(value, expected):
    assert shown(value) == expected


@pytest.mark.parametrize("digits", [41, 4300, 10_000])
def test_a_long_integer_keeps_its_first_digits_and_says_how_many(digits):
    """Even past Python's int-to-str limit (4,300 digits), which made str() raise."""
    value = int("7" * digits) if digits <= 4300 else 7 * (10**digits - 1) // 9
    assert shown(value) == f"{'7' * SHOWN_CHARS}… ({digits:,} digits)"
    assert shown(-value) == f"-{'7' * SHOWN_CHARS}… ({digits:,} digits)"


def test_a_long_integer_is_never_converted_whole():
    """A lower int-to-str limit (an application's choice) is no error either."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert shown(10**5000).endswith("(5,001 digits)")
    finally:
        sys.set_int_max_str_digits(old)


@pytest.mark.parametrize("digits", [1, 9, 10, 99, 100, 128, 129, 1000])
def test_the_digit_count_is_exact_at_powers_of_ten(digits):
    assert shown(10 ** (digits - 1), limit=0).endswith(f"({digits:,} digits)")
    assert shown(10**digits - 1, limit=0).endswith(f"({digits:,} digits)")


def test_a_long_string_keeps_its_first_characters_and_says_how_many():
    assert shown("x" * 5000) == f"'{'x' * SHOWN_CHARS}…' (5,000 characters)"
    assert shown("it's" * 30).startswith("\"it's") and shown("it's" * 30).endswith('…" (120 characters)')


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (list(range(1_000_000)), "(1,000,000 items)"),
        ([10**4000], "(1 item)"),
        (["y" * 10**6, 1], "(2 items)"),
        ({str(i): i for i in range(100)}, "(100 entries)"),
        ({"k" * 1000: 1}, "(1 entry)"),
    ],
)
def test_a_long_collection_keeps_its_first_items_and_says_how_many(value, size):
    text = shown(value)
    assert text.endswith(size) and len(text) <= SHOWN_CHARS + len(size) + 2, text


def test_a_field_name_is_unquoted_unless_long():
    assert shown_name("max_tokens") == "max_tokens" and shown_name(3) == "3"
    assert shown_name("k" * 100) == f"'{'k' * SHOWN_CHARS}…' (100 characters)"


def test_other_libraries_text_is_whole_up_to_its_limit_then_cut_with_its_size():
    from trtforge.errors import CLIPPED_CHARS, clipped

    assert clipped("a short reason") == "a short reason"
    assert clipped("y" * CLIPPED_CHARS) == "y" * CLIPPED_CHARS
    long = "z" * 5000
    assert clipped(long) == "z" * CLIPPED_CHARS + "… (5,000 characters)"
    assert clipped(long, limit=10) == "z" * 10 + "… (5,000 characters)"
