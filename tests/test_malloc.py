"""glibc's malloc keeps freed memory when asked (ckpt.measure), so a repeated step takes no page faults."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import ModelResult, SettingResult
from benchmarks.report import write_results
from benchmarks.settings import SETTINGS
from ckpt.measure import glibc_malloc, minor_faults, set_malloc

ROOT = Path(__file__).resolve().parents[1]

# Apply --malloc as the timing commands do (set_malloc); then allocate 64 MiB in 4 MiB blocks,
# touch every page (touch_pages, whose source goes first), free it all (and with "release", give
# the freed memory back); four times.  The page faults of the last three rounds tell whether the
# memory was given back in between.
_ROUNDS = """
import json, sys
sys.path.insert(0, {root!r})
from ckpt.measure import minor_faults, release_freed_memory, set_malloc
described = set_malloc("default" if sys.argv[1] == "default" else "keep")
assert (described == "default") == (sys.argv[1] == "default"), described
def one_round():
    before = minor_faults()
    blocks = [bytearray(4 << 20) for _ in range(16)]
    for block in blocks:
        touch_pages(block)
    del blocks
    if sys.argv[1] == "release":
        release_freed_memory()
    return minor_faults() - before
print(json.dumps([one_round() for _ in range(4)]))
"""

PAGES = 64 * 2**20 // 4096


def touch_pages(block: bytearray) -> None:
    """Write one byte in every 4 KiB page of ``block``, so each page is mapped in."""
    block[::4096] = bytes(len(range(0, len(block), 4096)))


def _faults(mode: str) -> list[int]:
    code = inspect.getsource(touch_pages) + _ROUNDS.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)


@pytest.mark.skipif(not glibc_malloc(), reason="glibc's malloc settings only")
def test_kept_memory_is_not_faulted_in_again_by_the_next_round_until_released():
    default, kept = _faults("default"), _faults("keep")
    # glibc's own thresholds give the 64 MiB back after each round: every page faults again.
    assert min(default[1:]) > PAGES // 2, default
    # Kept: only the first round faults its pages in.
    assert kept[0] > PAGES // 2, kept
    assert max(kept[1:]) < PAGES // 100, kept
    # Kept, but released after each round (as the benchmark does between models): given back again.
    released = _faults("release")
    assert min(released[1:]) > PAGES // 2, released


def test_an_unknown_malloc_mode_is_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"malloc mode 'jemalloc': expected one of keep, default"):
        set_malloc("jemalloc")
    assert set_malloc("default") == "default"  # changes nothing


def test_minor_faults_counts_pages_touched_for_the_first_time():
    before = minor_faults()
    if before is None:
        pytest.skip("no getrusage on this platform")
    block = bytearray(64 << 20)  # large enough to be mapped afresh, and zeroed page by page
    touch_pages(block)
    assert minor_faults() - before > PAGES // 2


def test_the_report_names_the_allocator_and_the_settings_that_took_page_faults(tmp_path):
    settings = [
        SettingResult(SETTINGS["compile"], activation_bytes=2**20, samples_s=[1.0] * 3, page_faults=[0, 0, 0]),
        SettingResult(SETTINGS["ckpt-none"], activation_bytes=2**20, samples_s=[1.0] * 3, page_faults=[2016, 0, 2100]),
        SettingResult(SETTINGS["ckpt-0.5"], activation_bytes=2**19, samples_s=[1.1] * 3, page_faults=[]),
    ]
    model = ModelResult("m", "M", transformer=True, size="cpu", params=1, config={}, settings=settings)
    meta = {
        "device": "cpu",
        "device_name": "CPU",
        "torch": "x",
        "dtype": "float32",
        "size": "cpu",
        "rounds": 3,
        "date": "today",
        "command": "python -m benchmarks.run",
        "malloc": "glibc malloc keeps freed memory (test)",
    }
    md, js = write_results(tmp_path, "faults", meta, [model])
    text = md.read_text()
    assert "Memory allocator: glibc malloc keeps freed memory (test)." in text
    assert "Page faults per timed step (median), where any: ckpt none 2,016." in text
    assert json.loads(js.read_text())["models"][0]["settings"][1]["page_faults"] == [2016, 0, 2100]
