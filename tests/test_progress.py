"""Progress off a terminal: lines a log can hold (no carriage returns), the last one the total."""

from dimmem.progress import progress


def test_off_a_terminal_progress_is_plain_lines(capsys):
    assert list(progress(range(5), desc="labeling", unit="job")) == [0, 1, 2, 3, 4]
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    assert err.strip().splitlines()[-1].startswith("labeling: 100%") and "5/5" in err
    list(progress(range(5), desc="quiet", enabled=False))
    assert capsys.readouterr().err == ""
