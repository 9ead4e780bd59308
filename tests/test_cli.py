"""`dimmem windows` end to end with the real Qwen3 tokenizer, and its error path."""

import json
import subprocess
import sys

from dimmem.cli import main
from dimmem.paths import shared_data


def test_windows_command_writes_jsonl_and_stats(tmp_path, locomo_path, capsys):
    sample = json.loads(locomo_path.read_text())[:1]
    source = tmp_path / "one.json"
    source.write_text(json.dumps(sample))
    out, stats = tmp_path / "w.jsonl", tmp_path / "stats.json"
    code = main(
        [
            "windows",
            "--format",
            "locomo",
            "--input",
            str(source),
            "--window",
            "15",
            "--overlap",
            "3",
            "--max-tokens",
            "2048",
            "--tokenizer",
            str(shared_data("qwen3-tokenizer")),
            "--out",
            str(out),
            "--stats-json",
            str(stats),
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"conversation_id", "window_index", "context_turns", "new_turns", "prompt_tokens"} <= set(rows[0])
    assert rows[0]["context_turns"] == [] and rows[1]["context_turns"] == rows[0]["new_turns"][-3:]
    new_ids = [t for row in rows for t in row["new_turns"]]
    assert len(new_ids) == len(set(new_ids)) == 419
    assert all(row["prompt_tokens"] <= 2048 for row in rows)
    report = json.loads(stats.read_text())
    assert report["windows"] == len(rows) and report["prompt_tokens"]["max"] == max(
        r["prompt_tokens"] for r in rows
    )
    printed = capsys.readouterr().out
    assert "prompt tokens   p50" in printed and "partition" in printed


def test_malformed_input_exits_2_with_location(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            [
                {
                    "sample_id": "s1",
                    "conversation": {
                        "session_1_date_time": "1:56 pm on 8 May, 2023",
                        "session_1": [{"speaker": "A", "text": "hi"}],
                    },
                }
            ]
        )
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dimmem",
            "windows",
            "--format",
            "locomo",
            "--input",
            str(bad),
            "--tokenizer",
            str(shared_data("qwen3-tokenizer")),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "bad.json: record 0 (s1): field 'conversation.session_1[0].dia_id': missing" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_memory_and_serve_command_groups_import_light():
    """`dimmem --help` must not pay for torch, numpy or FastAPI: the memory and serve command groups
    import them inside their handlers."""
    code = (
        "import sys, argparse\n"
        "from dimmem.runtime import cli as memory_cli\n"
        "from serve import cli as serve_cli\n"
        "for module in (memory_cli, serve_cli):\n"
        "    module.add_arguments(argparse.ArgumentParser())\n"
        "heavy = {'numpy', 'torch', 'transformers', 'sentence_transformers', 'fastapi', 'uvicorn',\n"
        "         'openai'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_memory_command_rejects_an_unknown_config_key_naming_it(tmp_path):
    import argparse

    import pytest

    from dimmem.config import ConfigError
    from dimmem.runtime import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "search",
            "--store",
            str(tmp_path / "m.sqlite"),
            "--user",
            "ann",
            "--set",
            "retrieval.dept=3",
            "hello",
        ]
    )
    with pytest.raises(ConfigError, match=r"default\.yaml: unknown key 'retrieval\.dept'"):
        cli.run(args)
