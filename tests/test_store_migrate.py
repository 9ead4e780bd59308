"""Moving a store (`dimmem memory migrate`): pending schema migrations applied in place on either backend,
a round trip SQLite -> Postgres -> SQLite that keeps every record (every status, versions, timestamps),
every history entry, every turn and every window (pending ones too), and the vectors, and a copy that
stops on a record no store keeps with the target as it was."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from test_adversarial_runtime import chat, rec, scripted

from devtools.hashing_embedder import HashingEmbedder
from dimmem.contract.windows import Window
from dimmem.runtime import cli
from dimmem.runtime.memory import Memory
from dimmem.runtime.stores import open_store, transfer

pytestmark = pytest.mark.integration


def memory_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dimmem memory")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def dumps(url: str) -> dict:
    store = open_store(url)
    try:
        return {user: transfer.dump(store, user) for user in transfer.users(store)}
    finally:
        store.close()


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for user in a:
        x, y = a[user], b[user]
        for part in ("records", "history", "turns", "windows"):
            assert x[part] == y[part], (user, part)
        assert sorted(x["vectors"]) == sorted(y["vectors"]), user
        for rid, vector in x["vectors"].items():
            assert np.array_equal(vector, y["vectors"][rid]), (user, rid)  # float32 exactly


def test_round_trip_sqlite_postgres_sqlite_is_lossless(tmp_path, pg_server, capsys):
    source = str(tmp_path / "a.sqlite")
    memory = Memory({"store": source, "windows": {"window": 4, "overlap": 1}}, embedder=HashingEmbedder())
    memory.add(chat(40), user_id="acme/ann", conversation_id="c1")
    memory.add(chat(6, start=40), user_id="acme/ann", conversation_id="c1")  # an append
    memory.add(chat(10, start=500), user_id="bob", conversation_id="c2")
    ids = [r["id"] for r in memory.get_all(user_id="acme/ann").memories]
    memory.update(ids[0], user_id="acme/ann", content="Ann went to the museum again.")
    memory.delete(ids[1], user_id="acme/ann")
    memory.delete(ids[2], user_id="acme/ann")
    memory.restore(ids[2], user_id="acme/ann")
    memory.consolidator = scripted  # a merge and a supersede: statuses and histories beyond ADD
    memory.add_records(
        [{**memory.get(ids[3], user_id="acme/ann"), "id": "again", "source_turns": ["S1:1"]}],
        user_id="acme/ann",
    )
    with memory.store.transaction():  # a window left pending (an add that did not finish)
        turns = memory.store.conversations.turns("bob", "c2")
        memory.store.conversations.put_windows("bob", [Window("c2", 99, (turns[0],), tuple(turns[1:3]))])
    memory.close()
    before = dumps(source)
    statuses = {r["status"] for r in before["acme/ann"]["records"]}
    assert statuses >= {"active", "deleted", "merged"} or statuses >= {"active", "deleted", "superseded"}
    assert any(not w["done"] for w in before["bob"]["windows"])

    middle = pg_server.fresh_database()
    assert memory_command(["migrate", "--from", source, "--to", middle]) == 0
    assert "copied 2 users" in capsys.readouterr().out
    assert_same(before, dumps(middle))
    back = f"sqlite:///{tmp_path / 'b.sqlite'}"
    assert memory_command(["migrate", "--from", middle, "--to", back]) == 0
    assert_same(before, dumps(back))

    # the copies are live stores: every path finds what the source found
    for url in (middle, back):
        copy = Memory({"store": url}, embedder=HashingEmbedder())
        hits = copy.search("Which museum did I visit?", user_id="acme/ann", k=5).hits
        assert hits and {"bm25", "dense"} <= set(hits[0].paths)
        assert copy.store.conversations.pending_windows("bob", "c2") == [(99, ["S1:1"], ["S1:2", "S1:3"])]
        copy.close()

    # a target that holds anything is refused, unless --force (then the copied users are replaced)
    with pytest.raises(ValueError, match="already holds 2 users"):
        memory_command(["migrate", "--from", source, "--to", middle])
    assert memory_command(["migrate", "--from", source, "--to", middle, "--force"]) == 0
    assert_same(before, dumps(middle))


def test_a_record_no_store_keeps_is_named_and_leaves_the_target_as_it_was(tmp_path, store_urls):
    """A record whose content holds a NUL character (SQLite keeps it, PostgreSQL refuses it) stops the copy
    into either backend before anything is written: neither the users copied before it nor, with --force,
    the target's own rows change, and the error names the user, the record and what is wrong."""
    source = str(tmp_path / "source.sqlite")
    memory = Memory({"store": source}, embedder=HashingEmbedder())
    memory.add_records([rec("a1", "Ann hiked up Eagle Peak.")], user_id="ann")
    memory.add_records([rec("b1", "Bob pasted\x00 a binary file.")], user_id="bob")
    memory.add_records([rec("c1", "Cy hiked up Eagle Peak.")], user_id="cy")
    memory.close()
    empty, seeded = store_urls("empty"), store_urls("seeded")
    memory = Memory({"store": seeded}, embedder=HashingEmbedder())
    memory.add_records([rec("t1", "Ann moved to Oslo.")], user_id="ann")  # a user the copy would replace
    memory.close()
    before = dumps(seeded)

    for target, force in ((empty, []), (seeded, ["--force"])):
        with pytest.raises(
            ValueError,
            match=r"user 'bob', record 'b1': content holds a NUL character .*; nothing was copied into",
        ):
            memory_command(["migrate", "--from", source, "--to", target, *force])
    assert dumps(empty) == {}
    assert_same(before, dumps(seeded))
    # text that is not Unicode cannot be written to a store from Python: a dump that holds some is refused too
    surrogate = {
        **dumps(source)["cy"],
        "turns": [{"conversation_id": "c", "turn_id": "D1:1", "text": "\ud800"}],
    }
    assert transfer.refusal(surrogate) == (
        "user 'cy', turn 'D1:1' of conversation 'c': text is not valid Unicode (surrogates not allowed at "
        "character 0)"
    )


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres"])
def test_migrate_in_place_prints_the_schema_version(tmp_path, pg_server, capsys, backend_name):
    # a Postgres database with no schema yet
    url = str(tmp_path / "m.sqlite") if backend_name == "sqlite" else pg_server.database("migrate_in_place")
    assert memory_command(["migrate", "--store", url]) == 0
    store = open_store(url, migrate=False)
    version = store.schema_version()
    store.close()
    assert (
        version >= 2 and f"schema version {version} ({version} migrations applied)" in capsys.readouterr().out
    )
    assert memory_command(["migrate", "--store", url]) == 0
    assert f"schema version {version} (0 migrations applied)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--from and --to go together"):
        memory_command(["migrate", "--from", url])


def test_memory_postgres_runs_a_local_server_until_interrupted(tmp_path):
    """`dimmem memory postgres --data DIR`: one command gives a migrated store URL (a login role under
    row-level security), usable by the runtime, and stops cleanly on Ctrl-C."""
    import signal
    import subprocess
    import sys

    from dimmem.runtime.memory import Memory

    proc = subprocess.Popen(
        [sys.executable, "-m", "dimmem", "memory", "postgres", "--data", str(tmp_path / "pg")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        url = lines[1].strip()
        assert url.startswith("postgresql://dimmem_app@"), lines
        memory = Memory({"store": url})
        memory.add([{"role": "user", "content": "I adopted a beagle named Biscuit."}], user_id="ann")
        assert memory.search("beagle", user_id="ann").hits
        memory.close()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
