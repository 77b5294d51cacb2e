"""`bench.lab.perfdiff` reads `perf report`'s separated output and says where B's extra samples are."""

from __future__ import annotations

from collections import Counter

from bench.lab.perfdiff import by_object, compare, parse_report

# `perf report --no-children --sort dso,sym -n -t '|'`, as perf 6.x prints it (abridged).
REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Total Lost Samples: 0
#
# Overhead|Samples|Shared Object|Symbol
#
 16.61% | 531        |[kernel.kallsyms]                       |[k] _raw_spin_unlock_irqrestore
 9.01%  | 288        |libpython3.11.so.1.0                    |[.] _PyEval_EvalFrameDefault
 1.63%  | 52         |[kernel.kallsyms]                       |[k] __inet_lookup_established
 0.10%  | 3          |loop.cpython-311-x86_64-linux-gnu.so    |[.] uv__io_poll

"""


def test_the_report_is_read_as_samples_per_object_and_symbol() -> None:
    """Rule: every sample row counts under (object, symbol) without its [k]/[.] mark; the
    header and blank lines count nothing."""
    samples = parse_report(REPORT)
    assert samples == {
        ("[kernel.kallsyms]", "_raw_spin_unlock_irqrestore"): 531,
        ("libpython3.11.so.1.0", "_PyEval_EvalFrameDefault"): 288,
        ("[kernel.kallsyms]", "__inet_lookup_established"): 52,
        ("loop.cpython-311-x86_64-linux-gnu.so", "uv__io_poll"): 3,
    }
    assert by_object(samples) == {
        "[kernel.kallsyms]": 583,
        "libpython3.11.so.1.0": 288,
        "loop.cpython-311-x86_64-linux-gnu.so": 3,
    }


def test_the_comparison_puts_the_growth_where_it_is() -> None:
    """Rule: totals, each object's difference and its share of the whole difference, and the
    symbols ordered by how much they grew from A to B (largest first)."""
    a = Counter({("k", "wake"): 100, ("py", "eval"): 100, ("py", "malloc"): 20})
    b = Counter({("k", "wake"): 130, ("py", "eval"): 160, ("py", "malloc"): 10})
    text = compare(a, b, ("off", "on"))
    assert text.startswith("samples: off 220, on 300 (1.364x)")
    assert "| py | 120 | 170 | +50 | 62% |" in text
    assert "| k | 100 | 130 | +30 | 38% |" in text
    symbols = text.split("symbol (grown most)")[1].splitlines()[2:]
    assert [row.split(" | ")[0] for row in symbols] == ["| eval", "| wake", "| malloc"]
    assert symbols[2].endswith("| -10 |")
