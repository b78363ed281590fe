"""The report page from plain records (closedloop/reports/html.py): escaped text, real PNG figures, the
monitors' table as the monitors stage writes it, and a page that cannot be made only warns."""

from __future__ import annotations

import base64
import re
import struct

import pytest

from closedloop.reports.page import PageData, feedback_versions

SUMMARY = {"overall": {"pass@1": 0.5, "se": 0.1, "tasks": 8},
           "envs": {"code": {"pass@1": 0.5, "se": 0.1, "tasks": 4}, "rules": {"pass@1": 0.5, "se": 0.1, "tasks": 4}},
           "slices": {"code/core": {"pass@1": 0.5, "se": 0.1, "tasks": 4}, "rules/core": {"pass@1": 0.5, "se": 0.1, "tasks": 4}}}
GATE = {"champion": SUMMARY, "candidate": SUMMARY, "promote": False, "trained": True,
        "reasons": ["overall pass@1 0.500 vs champion 0.500 (+0.000 does not exceed min_improvement 0.0)",
                    "monitor length_inflation failed: <b>held</b>"],
        "settings": {"min_improvement": 0.0, "noise_z": 2.0, "slice_tolerance": 0.05}}
MONITORS = {"iteration": 2, "failing": ["length_inflation"], "holding": ["length_inflation"], "monitors": [
    {"name": "length_inflation", "version": "1a2b", "verdict": "fail", "value": 0.71, "warn": 0.3, "fail": 0.5,
     "figures": {"code.corr": 0.71}, "message": "failed samples grew <script>alert(1)</script>"},
    {"name": "canary", "version": "9f9f", "verdict": "skipped", "value": None, "warn": None, "fail": None,
     "figures": {}, "message": "no canary set yet"},
]}


def _page(**changes) -> PageData:
    rewards = [{"sample_id": f"{env}#{i}", "env": env, "reward": i / 4, "passed": i == 3,
                "components": {"format": 1.0, "tests_passed": i / 4, "human": None},
                "sources": {f"verifier:{env}": "v1", f"component:{env}/format": "c1"}}
               for env in ("code", "rules") for i in range(4)]
    samples = [{"sample_id": row["sample_id"], "env": row["env"], "completion": "x" * (10 + i),
                "completion_tokens": 5 + i} for i, row in enumerate(rewards)]
    data = dict(iteration=2, experiment="iter-002-abcdef12", exp_rev="f" * 40, git_rev="e" * 40,
                read_from="DVC experiment iter-002-abcdef12", samples=samples, rewards=rewards, gate=GATE,
                evaluation=None, monitors=MONITORS,
                history=[{"iteration": i, "name": n, "candidate": 0.1 * i, "champion": 0.1}
                         for i in (0, 1, 2) for n in ("overall", "code", "rules", "code/core", "rules/core")],
                hashes={"data/batch/rewards.jsonl": "a" * 32}, sources=feedback_versions(rewards),
                mlflow={"run_id": "r" * 32, "experiment_id": "1", "tracking_uri": "sqlite:////tmp/x/mlflow.db",
                        "model_version": "3", "parent_version": "2", "registered_model": "closedloop-policy"})
    return PageData(**{**data, **changes})


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_page_embeds_real_pngs_and_escapes_every_text():
    from closedloop.reports.html import render

    page = render(_page())
    images = _pngs(page)
    assert len(images) == 4  # pass@1 per env, per slice, reward components, lengths
    for data in images:
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert width > 300 and height > 200
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>held</b>" not in page and "&lt;b&gt;held&lt;/b&gt;" in page
    assert "http" not in page.split("<body>")[1]  # self-contained: nothing fetched from elsewhere


def test_monitors_table_names_each_monitor_and_what_holds():
    from closedloop.reports.html import render

    page = render(_page())
    section = page.split("<h2>Monitors</h2>")[1].split("<h2>")[0]
    assert "<code>length_inflation</code>" in section and "<code>canary</code>" in section
    assert '<span class="v fail">fail</span>' in section and '<span class="v skip">skipped</span>' in section
    assert "holding promotion: <strong>length_inflation</strong>" in section
    absent = render(_page(monitors=None)).split("<h2>Monitors</h2>")[1].split("<h2>")[0]
    assert "The monitors did not run for this iteration" in absent


def test_gate_lineage_and_sources_are_on_the_page():
    from closedloop.reports.html import render

    page = render(_page())
    assert "<strong>Held:</strong>" in page and "champion v2" in page and "candidate v3" in page
    assert "<code>iter-002-abcdef12</code>" in page and "a" * 32 in page
    assert "mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db" in page and "r" * 32 in page
    assert "<code>verifier:code</code>" in page and "components of <code>rules</code>" in page


@pytest.mark.parametrize("rows, expected", [
    ([{"sources": {"verifier:code": "a"}}, {"sources": {"verifier:code": "a"}}], {"verifier:code": ["a"]}),
    # a source whose version changed within the batch names both
    ([{"sources": {"verifier:code": "a"}}, {"sources": {"verifier:code": "b"}}], {"verifier:code": ["a", "b"]}),
    # rows written before `sources` carry `feedback_sources`
    ([{"feedback_sources": {"combiner": "c"}}], {"combiner": ["c"]}),
    ([{}], {}),
])
def test_feedback_versions(rows, expected):
    assert feedback_versions(rows) == expected


def test_a_page_that_cannot_be_made_warns_and_keeps_the_records(tmp_path, capsys):
    from closedloop.config import Params
    from closedloop.versioning.register import log_report
    from closedloop.workspace import Workspace

    params = Params()
    params.loop.iteration = 4
    result = log_report(Workspace.at(tmp_path), params, "no-such-run", {})
    assert set(result) == {"report_error"} and "no iteration has been recorded" in result["report_error"]
    err = capsys.readouterr().err
    assert "WARNING: the report page of iteration 4 was not logged" in err and "ReportError" in err
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("summary, expected", [
    # a local store: the artifact's file, which a browser opens
    ({"report_artifact": "file:///ws/mlartifacts/1/abc/artifacts/report-iteration-2.html",
      "tracking_uri": "sqlite:////ws/mlflow.db"}, "`/ws/mlartifacts/1/abc/artifacts/report-iteration-2.html`"),
    # a tracking server: its download route, without the credentials of the URI
    ({"report_artifact": "mlflow-artifacts:/1/abc/artifacts/report-iteration-2.html", "run_id": "abc",
      "tracking_uri": "http://user:secret@mlflow.local:5000"},
     "[report-iteration-2.html](http://mlflow.local:5000/get-artifact?path=report-iteration-2.html&run_uuid=abc)"),
    # a page that failed: why, and how to write it
    ({"report_error": "ReportError: boom"}, "not logged (ReportError: boom); `closedloop report --iteration 2"),
])
def test_gate_report_links_the_page(summary, expected):
    from closedloop.reports.gate_report import gate_markdown

    text = gate_markdown(GATE, {"iteration": 2, "promoted": False, "model_version": "3", "parent_version": "2",
                                **summary})
    (line,) = [line for line in text.splitlines() if line.startswith("- report page: ")]
    assert expected in line and "secret" not in text


def test_episodes_show_pass_at_1_after_each_round_as_a_figure_and_a_table():
    from closedloop.reports.html import render

    by_round = [{**SUMMARY, "overall": {**SUMMARY["overall"], "pass@1": value}} for value in (0.25, 0.375, 0.5)]
    rounds = {"by_round": by_round, "correction_rate": {"failed_first": 6, "fixed": 2, "rate": 1 / 3}}
    champion_rounds = {"by_round": by_round[:1] * 3, "correction_rate": {"failed_first": 6, "fixed": 0, "rate": 0.0}}
    page = render(_page(evaluation={"candidate": {"summary": SUMMARY, "rounds": rounds},
                                    "champion": {"summary": SUMMARY, "rounds": champion_rounds}}))
    assert "Episodes: pass@1 after each round" in page and "The gate decided on round 3" in page
    assert "2 of 6 were fixed in a later round" in page
    assert len(_pngs(page)) == 5  # the round curve beside the four figures of every page
    assert re.search(r"<td[^>]*>3</td><td[^>]*>0\.500</td><td[^>]*>0\.250</td>", page)
    assert "Episodes" not in render(_page())  # single attempts: no such section
