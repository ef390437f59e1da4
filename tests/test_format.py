"""``instrument.base.formatting``: the one time formatter and column fitter behind the console
table, the CLI's tables and the verdicts' reasons."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from instrument.base.formatting import (
    MIN_NAME_WIDTH,
    WIDTH,
    fit,
    format_delta_us,
    format_time_us,
    row,
)

# ---------------------------------------------------------------- times


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (0.0, "0.000us"),
        (0.0004, "0.000us"),  # below the last digit
        (0.001, "0.001us"),  # 1 ns: the smallest step shown
        (0.25, "0.250us"),  # sub-microsecond stays in us (nanosecond resolution)
        (1.0, "1.000us"),
        (23.0, "23.000us"),
        (999.999, "999.999us"),
        (999.9994, "999.999us"),  # rounds down: stays in us
        (999.9996, "1.000ms"),  # rounds up to 1000: moves to ms, never "1000.000us"
        (1000.0, "1.000ms"),
        (1234.5, "1.234ms"),  # 1.2345 is stored just below: rounds down, as f-strings do
        (37550.0, "37.550ms"),
        (999_999.0, "999.999ms"),
        (999_999.6, "1.000s"),  # rounds up to 1000 ms: moves to s
        (1e6, "1.000s"),
        (1.25e6, "1.250s"),
        (3.6e9, "3600.000s"),  # an hour: seconds stay the largest unit
        (1e15, "1000000000.000s"),
    ],
)
def test_times_use_the_largest_unit_that_reads_at_least_one(us, text):
    assert format_time_us(us) == text


def test_every_unit_boundary_moves_exactly_when_the_rounded_value_reaches_1000():
    for boundary, below, above in ((1e3, "us", "ms"), (1e6, "ms", "s")):
        scale = boundary / 1e3  # the size of one unit below the boundary, in us
        assert format_time_us(boundary - 0.0006 * scale).endswith("999.999" + below)
        assert format_time_us(boundary - 0.0004 * scale) == "1.000" + above
        assert format_time_us(boundary) == "1.000" + above


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (-0.0, "0.000us"),  # no "-0.000us"
        (-5.0, "-5.000us"),
        (-5000.0, "-5.000ms"),  # the same unit as +5000 (a clock step back, a delta)
        (-2.5e6, "-2.500s"),
    ],
)
def test_negative_times_carry_a_sign_before_the_same_digits(us, text):
    assert format_time_us(us) == text


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (math.nan, "nan"),
    ],
)
def test_non_finite_times_print_as_themselves(us, text):
    assert format_time_us(us) == text


def test_an_integer_formats_as_its_float():
    assert format_time_us(1500) == format_time_us(1500.0) == "1.500ms"


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (0.0, "+0.000us"),
        (1250.0, "+1.250ms"),
        (-23.0, "-23.000us"),
        (-2e6, "-2.000s"),
    ],
)
def test_deltas_always_carry_a_sign(us, text):
    assert format_delta_us(us) == text


# ---------------------------------------------------------------- columns


def test_a_name_that_fits_is_kept_whole():
    assert fit("aten::mm", 8) == "aten::mm"
    assert fit("", 5) == ""


def test_a_long_name_loses_its_end_behind_an_ellipsis():
    cut = fit("aten::convolution_backward", 12)
    assert cut == "aten::con..."
    assert len(cut) == 12


def test_middle_cut_keeps_the_layer_index_and_the_leaf():
    path = "model.layers.17.post_attention_layernorm"
    cut = fit(path, 24, middle=True)
    assert len(cut) == 24
    assert cut == "model.laye...n_layernorm"
    assert cut.startswith(path[:10]) and cut.endswith(path[-10:])


def test_middle_cut_gives_the_odd_character_to_the_end():
    assert fit("abcdefghij", 8, middle=True) == "ab...hij"


def test_widths_too_small_for_the_ellipsis_cut_without_one():
    assert fit("abcdef", 4) == "a..."
    assert fit("abcdef", 3) == "abc"
    assert fit("abcdef", 1, middle=True) == "a"
    assert fit("abcdef", 0) == ""
    assert fit("abcdef", -2) == ""


def test_no_cut_ever_passes_its_width():
    name = "x" * 50
    for width in range(60):
        for middle in (False, True):
            assert len(fit(name, width, middle)) == min(width, 50)


def test_a_row_pads_the_name_column_and_keeps_the_numbers_whole():
    numbers = f"{'12':>6}{format_time_us(1500.0):>11}"
    line = row("f", numbers, 30)
    assert line == "f" + " " * 29 + numbers
    assert row("f", numbers, 30).endswith("1.500ms")


def test_by_default_the_name_column_takes_what_the_numbers_leave():
    numbers = "n" * 40
    line = row("r" * 200, numbers)
    assert len(line) == WIDTH
    assert line == "r" * (WIDTH - 40 - 3) + "..." + numbers


def test_wide_numbers_shrink_the_name_column_to_stay_within_width():
    numbers = "n" * 80
    line = row("model.layers.1.self_attn.q_proj", numbers, 40, middle=True)
    assert line == "model.la...tn.q_proj" + numbers  # 20 columns left for the name
    assert len(line) == WIDTH


def test_the_name_column_never_shrinks_below_its_minimum():
    numbers = "n" * (WIDTH - 2)
    line = row("abcdefghijkl", numbers, 40)
    assert line == fit("abcdefghijkl", MIN_NAME_WIDTH) + numbers
    assert len(line) == MIN_NAME_WIDTH + len(numbers)  # past WIDTH: numbers are never cut


def test_the_module_imports_neither_torch_nor_instrument():
    """Exporters import it, and exporters never import torch or instrument internals."""
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('fmt', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'instrument',"
        " 'exporters')))\n"
    )
    import instrument.base.formatting

    out = subprocess.run(
        [sys.executable, "-c", code, instrument.base.formatting.__file__],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"
