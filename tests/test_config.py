"""The one config loader: precedence of file, `--set` and flags, and one-line errors naming file and key."""

import pytest

from dimmem.config import ConfigError, Section, WindowConfig, load_config


class Teacher(Section):
    model: str = "m"
    rpm: float | None = 100.0


class Run(Section):
    out: str
    limit: int | None = None
    teacher: Teacher = Teacher()
    windows: WindowConfig = WindowConfig()


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("out: runs/x\nlimit: 5\nteacher: {model: big}\n")
    return path


def test_file_then_set_then_flags(config_file):
    assert load_config(Run, config_file).limit == 5
    assert load_config(Run, config_file, ["limit=7"]).limit == 7
    # a flag not given (None) leaves the --set value in place; a given flag wins over it
    assert load_config(Run, config_file, ["limit=7"], flags={"limit": None}).limit == 7
    assert load_config(Run, config_file, ["limit=7"], flags={"limit": 9}).limit == 9
    cfg = load_config(
        Run, config_file, ["teacher.rpm=null", "windows.window=8"], flags={"teacher.model": "x"}
    )
    assert (cfg.teacher.model, cfg.teacher.rpm, cfg.windows.window) == ("x", None, 8)  # null clears a key


class Bench(Section):
    out: str = "o"
    windows: WindowConfig = WindowConfig(window=25, overlap=5)
    nested: Run = Run(out="inner", windows=WindowConfig(window=12, overlap=3))


def test_a_section_given_in_part_keeps_its_fields_default(tmp_path):
    """`--set windows.max_tokens=N` (or a YAML naming one key of a section) keeps the other keys the
    field's default sets, at any depth, rather than the section class's own defaults."""
    cfg = load_config(
        Bench, None, ["windows.max_tokens=900", "windows.tokenizer=t", "nested.windows.overlap=2"]
    )
    assert (cfg.windows.window, cfg.windows.overlap, cfg.windows.max_tokens) == (25, 5, 900)
    assert (cfg.nested.out, cfg.nested.windows.window, cfg.nested.windows.overlap) == ("inner", 12, 2)
    path = tmp_path / "b.yaml"
    path.write_text("windows: {overlap: 1}\n")
    assert (load_config(Bench, path).windows.window, load_config(Bench, path).windows.overlap) == (25, 1)
    with pytest.raises(ConfigError, match=r"overlap \(5\) must be smaller than window \(4\)"):
        load_config(Bench, None, ["windows.window=4"])  # the kept default is checked with the new key


@pytest.mark.parametrize(
    "text,overrides,message",
    [
        ("out: x\nteachr: {model: m}\n", [], "unknown key 'teachr'"),
        ("out: x\n", ["teacher.modle=m"], "unknown key 'teacher.modle'"),
        ("limit: 3\n", [], "missing key 'out'"),
        ("out: x\nlimit: many\n", [], "limit: "),
        ("out: x\nwindows: {window: 0}\n", [], "windows.window"),
        ("out: x\nwindows: {window: 5, overlap: 5}\n", [], "overlap (5) must be smaller than window (5)"),
        ("out: [x\n", [], "line 2: invalid YAML"),
        ("- out\n", [], "expected a mapping of settings"),
        ("out: x\nlimit: 2\n", ["limit.deep=1"], "limit is not a section"),
        ("out: x\n", ["novalue"], "expected KEY=VALUE"),
    ],
)
def test_mistakes_name_the_file_and_the_key(tmp_path, text, overrides, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(Run, path, overrides)
    assert message in str(error.value) and "\n" not in str(error.value)
    if "override" not in message and "KEY=VALUE" not in message:
        assert str(error.value).startswith(str(path))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(Run, tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="missing key 'out'"):
        load_config(Run, tmp_path / "empty.yaml")
    assert load_config(Run, tmp_path / "empty.yaml", flags={"out": "o"}).out == "o"
