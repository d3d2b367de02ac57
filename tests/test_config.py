"""Budget and option parsing: every accepted form, and a clear error for everything else."""

from __future__ import annotations

import pytest

from ckpt.config import (
    ENV_VARS,
    Budget,
    CkptConfig,
    PeakCap,
    auto_peak_bytes,
    format_bytes,
    parse_budget,
    parse_peak,
)

GiB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, Budget()),
        ("none", Budget()),
        ("NONE", Budget()),
        ("0.3", Budget(fraction=0.3)),
        ("0", Budget(fraction=0.0)),
        ("1", Budget(fraction=1.0)),
        ("1.0", Budget(fraction=1.0)),
        (0.25, Budget(fraction=0.25)),
        ("1.5GiB", Budget(max_bytes=int(1.5 * GiB))),
        ("1.5gib", Budget(max_bytes=int(1.5 * GiB))),
        ("800MB", Budget(max_bytes=800_000_000)),
        ("512MiB", Budget(max_bytes=512 * 1024**2)),
        ("12 KiB", Budget(max_bytes=12 * 1024)),
        ("2kb", Budget(max_bytes=2000)),
        ("100B", Budget(max_bytes=100)),
        ("3GB", Budget(max_bytes=3_000_000_000)),
    ],
)
def test_budget_accepted_forms(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["-1", "1.5", "abc", "12XB", "nan", "", "inf", "GiB", "-2MB", "1.5 GiB extra", True])
def test_budget_rejects_with_a_message_naming_variable_value_and_forms(text):
    with pytest.raises(ValueError) as info:
        parse_budget(text, "CKPT_MEMORY_BUDGET")
    message = str(info.value)
    assert "CKPT_MEMORY_BUDGET" in message
    assert repr(text) in message
    assert "GiB" in message and "[0, 1]" in message


def test_fraction_resolves_against_the_no_recompute_plan():
    assert Budget(fraction=0.5).resolve(1001) == 500
    assert Budget(max_bytes=77).resolve(1001) == 77
    assert Budget().resolve(1001) is None


def test_options_override_environment():
    config = CkptConfig.from_sources({"memory_budget": "512MiB"}, {"CKPT_MEMORY_BUDGET": "0.3"})
    assert config.budget == Budget(max_bytes=512 * 1024**2)
    config = CkptConfig.from_sources({}, {"CKPT_MEMORY_BUDGET": "0.3", "CKPT_STRICT": "1", "CKPT_DEVICE": "h100"})
    assert config.budget == Budget(fraction=0.3)
    assert config.strict and config.device == "h100"


def test_unknown_option_lists_accepted_keys():
    with pytest.raises(ValueError) as info:
        CkptConfig.from_sources({"memory_budjet": "0.5"}, {})
    assert "memory_budjet" in str(info.value)
    assert "memory_budget" in str(info.value) and "strict" in str(info.value)


def test_bad_option_value_names_the_option():
    with pytest.raises(ValueError, match=r"options\['memory_budget'\]"):
        CkptConfig.from_sources({"memory_budget": "lots"}, {})
    with pytest.raises(ValueError, match="CKPT_DEVICE"):
        CkptConfig.from_sources({}, {"CKPT_DEVICE": "tpu"})
    with pytest.raises(ValueError, match="CKPT_STRICT"):
        CkptConfig.from_sources({}, {"CKPT_STRICT": "maybe"})


@pytest.mark.parametrize("name", sorted(ENV_VARS.values()))
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_variable_counts_as_unset(name, empty):
    assert CkptConfig.from_sources(environ={name: empty}) == CkptConfig()


def test_an_empty_cache_dir_falls_back_to_the_default(tmp_path):
    from ckpt.config import cache_dir

    assert cache_dir({"CKPT_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "ckpt"


def test_an_unknown_variable_is_warned_about_once_with_the_closest_name():
    import ckpt.config as config

    environ = {"CKPT_MEMORY_BUDGT": "0.3", "CKPT_MEMORY_BUDGET": "0.5"}
    config._warned_variables.discard("CKPT_MEMORY_BUDGT")
    with pytest.warns(config.ConfigWarning, match="CKPT_MEMORY_BUDGT .*did you mean CKPT_MEMORY_BUDGET"):
        parsed = CkptConfig.from_sources(environ=environ)
    assert parsed.budget == Budget(fraction=0.5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CkptConfig.from_sources(environ=environ)  # once per process: no second warning


def test_known_variables_raise_no_warning():
    import warnings

    import ckpt.config as config

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CkptConfig.from_sources(environ={name: "" for name in config.KNOWN_VARIABLES})


# ---------------------------------------------------------------- CKPT_PEAK_MEMORY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, PeakCap()),
        ("none", PeakCap()),
        ("0.5", PeakCap(fraction=0.5)),
        (0.25, PeakCap(fraction=0.25)),
        ("0", PeakCap(fraction=0.0)),
        ("6GiB", PeakCap(max_bytes=6 * GiB)),
        ("800MB", PeakCap(max_bytes=800_000_000)),
        ("auto", PeakCap(auto=True)),
        (" AUTO ", PeakCap(auto=True)),
    ],
)
def test_peak_accepted_forms(text, expected):
    assert parse_peak(text) == expected


@pytest.mark.parametrize("text", ["-1", "1.5", "abc", "12XB", "nan", "", "autoo", True, "-2MB"])
def test_peak_rejects_with_a_message_naming_variable_value_and_forms(text):
    with pytest.raises(ValueError) as info:
        parse_peak(text, "CKPT_PEAK_MEMORY")
    message = str(info.value)
    assert message.startswith(f"CKPT_PEAK_MEMORY={text!r} is not a valid peak memory cap")
    assert "'auto'" in message and "GiB" in message and "fraction" in message


def test_peak_option_overrides_the_environment_and_names_the_option_in_errors():
    config = CkptConfig.from_sources({"peak_memory": "0.5"}, {"CKPT_PEAK_MEMORY": "2GiB"})
    assert config.peak == PeakCap(fraction=0.5)
    assert CkptConfig.from_sources(None, {"CKPT_PEAK_MEMORY": "2GiB"}).peak == PeakCap(max_bytes=2 * GiB)
    assert CkptConfig.from_sources(None, {}).peak.unlimited
    with pytest.raises(ValueError, match=r"options\['peak_memory'\]='lots'"):
        CkptConfig.from_sources({"peak_memory": "lots"}, {})


def test_peak_fraction_resolves_against_the_no_recompute_peak():
    assert PeakCap(fraction=0.5).resolve(1001) == 500
    assert PeakCap(max_bytes=7).resolve(1001) == 7
    assert PeakCap().resolve(1001) is None
    with pytest.raises(ValueError, match="auto"):
        PeakCap(auto=True).resolve(1001)


@pytest.mark.parametrize(
    ("free", "total", "expected"),
    [
        (70 * GiB, 80 * GiB, 62 * GiB),  # margin: 10% of 80 GiB
        (5 * GiB, 8 * GiB, 4 * GiB),  # margin: 1 GiB (10% would be 0.8 GiB)
        (GiB // 2, 8 * GiB, 0),  # less free than the margin
    ],
)
def test_auto_margin_arithmetic(free, total, expected):
    assert auto_peak_bytes(free, total) == expected


def test_auto_margin_rejects_inconsistent_memory():
    with pytest.raises(ValueError, match="free_bytes"):
        auto_peak_bytes(9 * GiB, 8 * GiB)


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (0, "0 bytes"),
        (1023, "1023 bytes"),
        (1024, "1.00 KiB (1024 bytes)"),
        (21264784, "20.28 MiB (21264784 bytes)"),
        (3 * GiB // 2, "1.50 GiB (1610612736 bytes)"),
    ],
)
def test_sizes_in_messages_read_in_binary_units_with_the_exact_count(nbytes, text):
    assert format_bytes(nbytes) == text
