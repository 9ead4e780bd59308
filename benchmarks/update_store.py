"""The update path's store work per record on both backends, side by side in one run: records consolidated
by the rules, embedded by a hashing embedder (microseconds a text), so what is timed is the store's part.

    python -m benchmarks.update_store --records 1000
    py-spy record -o profile.txt -f raw -- python -m benchmarks.update_store --stores postgres

Each store first takes `--records / 2` records (warm-up, not timed), then `--records` more, 500 per
`add_records`, in one user. Postgres runs on an embedded server with fsync on, as the runtime's login role.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.runtime import backends, synthetic
from devtools.hashing_embedder import HashingEmbedder
from dimmem.contract.loaders import load_conversations
from dimmem.paths import shared_data
from dimmem.runtime.memory import Memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.update_store", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    args = parser.parse_args(argv)
    conversations = load_conversations("locomo", Path(args.locomo))
    texts = [f"{t.speaker}: {t.text}" for c in conversations for t in c.turns]
    warm = args.records // 2
    rows = [r for r, _ in synthetic(warm + args.records, texts, HashingEmbedder().encode(texts))]
    names = [n for n in args.stores.split(",") if n]
    with tempfile.TemporaryDirectory() as workdir, backends(names, Path(workdir)) as made:
        for name in names:
            memory = Memory({"store": made[name][0]("update")}, embedder=HashingEmbedder())
            memory.add_records(rows[:warm], user_id="u")
            start = time.perf_counter()
            for i in range(warm, len(rows), 500):
                memory.add_records(rows[i : i + 500], user_id="u")
            ms = (time.perf_counter() - start) / args.records * 1000
            decisions = {a: memory.stats[a] for a in ("KEEP_BOTH", "SUPERSEDE", "MERGE")}
            print(f"{name}: {ms:.2f} ms a record through the update path; decisions {decisions}", flush=True)
            memory.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
