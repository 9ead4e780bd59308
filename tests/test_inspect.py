"""`dimmem inspect` over real outputs of the pipeline: a datagen output with a repaired and a quarantined
window (the fake teacher), two eval runs scored against it, and a memory store loaded from its labels
with one record edited. The browser tests drive Debian's headless Chromium through selenium (a missing
browser fails them); the others read the pages over HTTP."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx2
import pytest
from datagen_helpers import mock_client, toy_config, window_marker

from data_gen.jobs_index import COLUMNS, HEAD, INDEX, JOBS, KEY
from data_gen.run import run as datagen
from devtools.browser import chromium, served
from devtools.fake_teacher import FakeTeacher
from devtools.sample_run import INVENTED, eval_run, memory_store, perturbed
from dimmem.jsonl_index import JsonlIndex
from inspector.cli import open_all
from inspector.config import InspectConfig

REPAIRED, QUARANTINED = (0, 1), (1, 1)  # (conversation, window) the teacher gets wrong first / twice


@pytest.fixture(scope="module")
def datagen_out(tmp_path_factory):
    cfg = toy_config(tmp_path_factory.mktemp("datagen"))
    cfg = cfg.model_copy(update={"split": cfg.split.model_copy(update={"validation": 0.3, "test": 0.3})})
    script = {
        window_marker(cfg, *REPAIRED): ["overlap", "ok"],
        window_marker(cfg, *QUARANTINED): ["nonjson"] * 2,
    }
    datagen(cfg, show_progress=False, http_client=mock_client(FakeTeacher(script)))
    return cfg


@pytest.fixture(scope="module")
def sources_spec(datagen_out, tmp_path_factory):
    """The paths given to `dimmem inspect`: datagen, two eval runs, a missing folder."""
    root = tmp_path_factory.mktemp("inspect")
    eval_run(datagen_out.out, root / "eval-teacher", json.dumps)
    eval_run(datagen_out.out, root / "eval-perturbed", perturbed)
    return [datagen_out.out, str(root / "eval-teacher"), str(root / "eval-perturbed"), str(root / "missing")]


@pytest.fixture(scope="module")
def store(datagen_out, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "memory.sqlite"
    return {"path": str(path), **memory_store(datagen_out, path)}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return InspectConfig(index_dir=str(tmp_path_factory.mktemp("index")), page_size=2)


def jobs_lines(datagen_out) -> list[dict]:
    text = (Path(datagen_out.out) / "jobs.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_jobs_jsonl_keeps_every_answer_and_the_validator_report(datagen_out):
    rows = {r["id"]: r for r in jobs_lines(datagen_out)}
    repaired = next(r for r in rows.values() if r["status"] == "repaired")
    quarantined = next(r for r in rows.values() if r["status"] == "quarantined")
    assert len(repaired["rounds"]) == 2 and "[source_turns_overlap]" in repaired["rounds"][0]["issues"]
    assert "issues" not in repaired["rounds"][1] and repaired["split"] in ("train", "validation", "test")
    assert [bool(r.get("issues")) for r in quarantined["rounds"]] == [True, True]
    assert quarantined["reason"].startswith("invalid after 1 repair round(s): json")
    window = repaired["window"]
    assert window["context"] and window["new"] and {"speaker", "session_time", "id"} <= set(window["new"][0])


def copied(datagen_out, folder: Path, index: bool = True) -> Path:
    """The datagen output's report and jobs.jsonl copied as `cp -p` does (times kept), with its index
    or as an output written before datagen wrote one."""
    folder.mkdir()
    for name in ("report.json", JOBS, *([INDEX] if index else [])):
        shutil.copy2(Path(datagen_out.out, name), folder / name)
    return folder


def listing(index) -> tuple[list[dict], dict]:
    """Everything the job list shows: each row of the index in file order, and the facets."""
    rows = [dict(r) for r in index.page(None, "line", index.count(), 0)]
    return rows, {c: [tuple(f) for f in index.facet(c)] for c in ("task", "status", "split", "reason")}


def test_datagen_index_opens_the_output_without_a_scan(datagen_out, tmp_path):
    index_dir = tmp_path / "index"
    [first] = open_all([datagen_out.out], InspectConfig(index_dir=str(index_dir)))
    assert first.jobs.file == Path(datagen_out.out, INDEX) and not first.jobs.built
    assert not index_dir.exists()  # nothing scanned, nothing cached
    [moved] = open_all(
        [str(copied(datagen_out, tmp_path / "moved"))], InspectConfig(index_dir=str(index_dir))
    )
    assert moved.jobs.file == tmp_path / "moved" / INDEX  # a moved or copied folder keeps its index
    scanned = JsonlIndex(Path(datagen_out.out, JOBS), COLUMNS, KEY, tmp_path / "scan", HEAD)
    assert scanned.built and listing(first.jobs) == listing(scanned)  # the same pages either way
    n = first.jobs.count()
    assert n == len(jobs_lines(datagen_out)) and first.jobs.count({"status": "quarantined"}) == 1
    last = first.jobs.page(None, "line", 1, n - 1)[0]
    assert first.jobs.get(last["id"])["id"] == last["id"]


def test_without_a_matching_index_the_output_is_scanned_once(datagen_out, config, tmp_path):
    older = copied(datagen_out, tmp_path / "older", index=False)
    [first] = open_all([str(older)], config)
    [again] = open_all([str(older)], config)
    assert first.jobs.built and not again.jobs.built  # the second start reads the cached index
    assert again.jobs.file.parent == Path(config.index_dir) and not (older / INDEX).exists()

    killed = copied(datagen_out, tmp_path / "killed", index=False)
    shutil.copy2(Path(datagen_out.out, INDEX), killed / f"{INDEX}.partial")  # killed before its rename
    [partial] = open_all([str(killed)], config)
    assert partial.jobs.file.parent == Path(config.index_dir)

    stale = copied(datagen_out, tmp_path / "stale")
    lines = (stale / JOBS).read_text().splitlines()
    first_row = json.loads(lines[0])
    lines[0] = json.dumps({**first_row, "status": "edited"}, ensure_ascii=False)
    (stale / JOBS).write_text("\n".join(lines[1:] + lines[:1]) + "\n")  # edited after datagen
    [edited] = open_all([str(stale)], config)
    assert edited.jobs.built and edited.jobs.file.parent == Path(config.index_dir)
    assert edited.jobs.count({"status": "edited"}) == 1
    assert edited.jobs.page(None, "line", 1, len(lines) - 1)[0]["id"] == first_row["id"]
    assert edited.jobs.get(first_row["id"])["status"] == "edited"


def test_bad_paths_ids_and_pages_are_pages_not_tracebacks(sources_spec, config):
    sources = open_all(sources_spec, config)
    assert [s.kind for s in sources] == ["datagen", "eval", "eval", "broken"]
    with served(sources, config) as base, httpx2.Client(base_url=base) as client:
        expected = {
            "/s/3": (422, "no such file or folder"),
            "/s/9": (404, "No such source"),
            "/s/0/jobs?page=999": (404, "No such page"),
            "/s/0/jobs?page=two": (400, "Bad page number"),
            "/s/0/job?id=nope": (404, "No such job"),
            "/s/0/job": (400, "id: Field required"),
            "/s/1/window?id=nope": (404, "No such window"),
            "/s/1/windows?order=random": (400, "Bad order"),
            "/s/1/jobs": (404, "Wrong kind of source"),
            "/compare?a=0&b=1": (404, "Wrong kind of source"),
            "/nowhere": (404, "no page /nowhere"),
        }
        for path, (status, text) in expected.items():
            response = client.get(path)
            assert (response.status_code, text in response.text) == (status, True), path
            assert "Traceback" not in response.text and "<html" in response.text
        refused = client.post("/s/0/jobs")  # read-only: GET pages only
        assert refused.status_code == 405 and "only reads" in refused.text


def test_malformed_sources_say_what_is_wrong(tmp_path, config):
    import sqlite3

    (tmp_path / "notes.txt").write_text("not a database")
    db = sqlite3.connect(tmp_path / "other.sqlite")
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    (tmp_path / "datagen").mkdir()
    (tmp_path / "datagen" / "report.json").write_text("{oops")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "metrics.json").write_text("{}")
    names = ["notes.txt", "other.sqlite", "datagen", "eval", "missing.sqlite"]
    sources = open_all([str(tmp_path / name) for name in names], config)
    problems = [s.problem for s in sources if s.kind == "broken"]
    assert len(problems) == 5
    for problem, expected in zip(
        problems,
        [
            "not a SQLite database",
            "not a memory store",
            "report.json: not JSON",
            "without windows.jsonl",
            "no such",
        ],
    ):
        assert expected in problem, problem
    assert not (tmp_path / "missing.sqlite").exists()  # opening never creates a store


# --- in a real browser ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    driver = chromium()  # no browser: this fails the run (make browser installs Debian's)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def site(sources_spec, store, config):
    with served(open_all([*sources_spec, store["path"]], config), config) as base:
        yield base


def rows(driver, table: str) -> list:
    return driver.find_elements("css selector", f"#{table} tbody tr")


def follow(driver, element) -> None:
    """Click a link or button and wait for the next page to replace this one.

    The old page is marked in its window object, which a navigation discards. Waiting
    on a stale element instead races the navigation: Chromium may answer a query on
    the half-replaced document with a protocol error rather than "stale".
    """
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_script("window.leavingThisPage = true")
    element.click()
    WebDriverWait(driver, 10, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script("return !window.leavingThisPage && document.readyState === 'complete'")
    )


@pytest.mark.integration
def test_browser_datagen_filter_window_and_highlight(browser, site):
    from selenium.webdriver import ActionChains
    from selenium.webdriver.support.ui import Select

    browser.get(f"{site}/")
    assert "no such file or folder" in browser.find_element("css selector", "tr.broken").text
    browser.get(f"{site}/s/0")
    cards = {c.find_element("class name", "label").text: c.find_element("class name", "num").text
             for c in browser.find_elements("class name", "card")}  # fmt: skip
    assert (cards["repaired"], cards["quarantined"]) == ("1", "1")
    follow(browser, browser.find_element("link text", "All jobs"))
    Select(browser.find_element("name", "status")).select_by_value("quarantined")
    follow(browser, browser.find_element("css selector", "#job-filters button"))
    [row] = rows(browser, "jobs")
    assert "quarantined" in row.text and "invalid after 1 repair round(s): json" in row.text
    follow(browser, row.find_element("css selector", "td a"))
    assert "Why it was quarantined" in browser.page_source
    assert len(browser.find_elements("css selector", "#rounds details.round")) == 2
    assert "not valid JSON" in browser.find_element("css selector", "pre.issues").text

    browser.get(f"{site}/s/0/jobs?status=repaired")
    follow(browser, rows(browser, "jobs")[0].find_element("css selector", "td a"))
    assert browser.find_elements("css selector", ".turn.context") and browser.find_elements(
        "css selector", ".turn.new"
    )
    assert browser.find_element("css selector", ".split").text in ("train", "validation", "test")
    record = browser.find_element("css selector", "#records .record")
    cited = set(record.get_attribute("data-cites").split())

    def lit(cls: str) -> set[str]:
        return {t.get_attribute("data-turn") for t in browser.find_elements("css selector", f".turn.{cls}")}

    assert not lit("lit")
    ActionChains(browser).move_to_element(record).perform()
    assert lit("lit") == cited
    ActionChains(browser).move_to_element(browser.find_element("tag name", "h1")).perform()
    assert not lit("lit")
    record.click()
    assert lit("pinned") == cited and "pinned" in record.get_attribute("class")


@pytest.mark.integration
def test_browser_eval_run_sorted_aligned_and_compared(browser, site):
    browser.get(f"{site}/s/2")
    metrics = browser.find_element("id", "metrics").text
    assert "memory F1" in metrics and "headline (0-100)" in metrics
    plots = browser.find_elements("css selector", ".plots img")
    assert len(plots) == 2 and all(int(p.get_attribute("naturalWidth")) > 0 for p in plots)
    follow(browser, browser.find_element("link text", "Windows, worst first"))
    scores = [float(r.find_elements("tag name", "td")[1].text) for r in rows(browser, "windows")]
    assert scores == sorted(scores) and scores[0] < 1.0
    follow(browser, rows(browser, "windows")[0].find_element("css selector", "td a"))
    diff = {
        r.find_element("tag name", "td").text.rstrip(" ≠")
        for r in browser.find_elements("css selector", "table.pair tr.diff")
    }
    assert {"type", "time"} <= diff
    assert INVENTED in browser.find_element("id", "invented").text
    assert "the window in" in browser.find_element("class name", "sub").text  # linked to its datagen window

    browser.get(f"{site}/")
    follow(browser, browser.find_element("css selector", "form.inline button"))
    compare = {r.find_elements("tag name", "td")[0].text: r.text for r in rows(browser, "compare")}
    assert compare["memory F1"].startswith("memory F1 1.000 0.") and compare["memory F1"].split()[
        -1
    ].startswith("-0.")


@pytest.mark.integration
def test_browser_store_search_and_history(browser, site, store):
    browser.get(f"{site}/s/4")
    assert "3 rows · page 1 of 2" in browser.find_element("class name", "pager").text
    follow(browser, browser.find_element("link text", "last"))
    assert [u.find_element("tag name", "a").text for u in rows(browser, "users")] == [store["user"]]
    follow(browser, browser.find_element("link text", store["user"]))
    assert len(rows(browser, "records")) == 2  # page_size, of 3
    follow(browser, browser.find_element("link text", "next"))
    assert rows(browser, "records")
    box = browser.find_element("name", "q")
    box.send_keys(store["edited"]["content"])
    follow(browser, browser.find_element("css selector", "#search button"))
    parsed = browser.find_element("id", "parsed").text
    assert "keywords" in parsed and "target_types" in parsed
    hits = rows(browser, "hits")
    assert "#1" in hits[0].text and "Really." in hits[0].text  # its own content: first on some path
    follow(browser, hits[0].find_element("css selector", "td:last-child a"))
    assert "Really." in browser.find_element("css selector", ".record .content").text
    history = browser.find_elements("css selector", "#history li")
    assert [h.text.split()[0:2] for h in history] == [["v1", "ADD"], ["v2", "UPDATE"]]
    assert "changed: content" in history[1].text
    sources = browser.find_elements("css selector", "#turns .turn.source")
    assert {s.get_attribute("data-turn") for s in sources} == set(store["edited"]["source_turns"])


@pytest.fixture(scope="module")
def locomo_run(tmp_path_factory):
    """A LoCoMo benchmark run of the rule extractor on one conversation."""
    from eval.cli import main as eval_main

    out = tmp_path_factory.mktemp("locomo") / "locomo-rule"
    fixed = ["--set", "locomo.thresholds.cosine=0.64", "--set", "locomo.thresholds.token_f1=0.3"]
    args = ["extraction", "--benchmark", "locomo", "--conversations", "conv-26", "--extractor", "turns"]
    assert eval_main([*args, *fixed, "--out", str(out)]) == 0
    return out


def test_locomo_run_shows_gold_beside_records(locomo_run, config):
    """The run's metrics with their intervals, and a window with LoCoMo's observations beside the kept
    records, each match named on both sides, and the window's turns."""
    (source,) = open_all([str(locomo_run)], config)
    assert source.kind == "eval" and source.locomo and "fact F1" in source.summary()
    with served([source], config) as base, httpx2.Client(base_url=base) as client:
        overview = client.get("/s/0").text
        assert "facts by content (cosine): recall" in overview and "locomo.png" in overview
        first = json.loads((locomo_run / "windows.jsonl").read_text().splitlines()[0])
        page = client.get("/s/0/window", params={"id": first["window_id"]}).text
        matched = next(g for g in first["gold"] if g["match"])
        assert matched["content"] in page and f"states {matched['id']}" in page
        assert 'id="gold"' in page and 'id="predicted"' in page and first["turns"][0]["text"] in page
        assert client.get("/s/0/window", params={"id": "conv-26/w9999"}).status_code == 404
