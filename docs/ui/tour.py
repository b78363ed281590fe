"""The README's screenshots, taken the way a user gets there: a real Prefect server, `closedloop serve`,
iterations triggered through the Prefect API as the UI's "Run" button does, a review paused before the
gate and answered through the API, the gate artifact in the Prefect UI, and the MLflow UI's chart of
benchmark pass@1 across iterations.

    .venv/bin/python docs/ui/tour.py docs/ui [WORKSPACE]   # needs: pip install playwright; uses /usr/bin/chromium

WORKSPACE (optional): a workspace a `make run` left, whose MLflow store the pass@1 chart is drawn from.

It runs the tiny test policy (tests/tiny.py) in a temporary workspace: a warm start and two iterations,
about five minutes on two cores. Set PREFECT_API_URL to use a Prefect server you already run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(condition, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"tour: timed out waiting for {what}")


def healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def api(fn):
    from prefect.client.orchestration import get_client

    async def call():
        async with get_client() as client:
            return await fn(client)

    return asyncio.run(call())


def shoot(url: str, path: Path, *, steps=(), height: int = 1000, settle_s: float = 4.0) -> None:
    """A screenshot of ``url`` after ``steps`` (functions of the page: clicks, typing) as a user does them."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": height})
        # "load", not "networkidle": the MLflow UI polls its server, so the network may never idle.
        page.goto(url, wait_until="load", timeout=120_000)
        time.sleep(5)
        for step in steps:
            step(page)
            time.sleep(1)
        time.sleep(settle_s)
        page.screenshot(path=str(path), full_page=False)
        browser.close()
    print(f"tour: wrote {path}")


def open_review_form(page) -> None:
    """Resume → the form; open the first sample's answer and fill it in as a reviewer would."""
    page.get_by_role("button", name="Resume").first.click()
    page.get_by_text("Reviewer").first.wait_for(timeout=30_000)
    page.get_by_role("textbox").first.fill("ada")
    page.get_by_role("button", name="SampleAnswer").first.click()


def pass_at_1_charts(page) -> None:
    """The runs' chart view, filtered to benchmark pass@1, without the assistant's side panel."""
    for name in ("Close", "Got it"):
        button = page.get_by_role("button", name=name)
        if button.count():
            button.first.click()
    page.get_by_placeholder("Search metric charts").fill("pass_at_1")


def main(out: Path, mlflow_from: Path | None = None) -> int:
    import yaml

    from tests.tiny import TINY

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="closedloop-tour-"))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    children: list[subprocess.Popen] = []
    try:
        if not env.get("PREFECT_API_URL"):
            port = free_port()
            env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
            env["PREFECT_HOME"] = str(tmp / "prefect-home")
            children.append(subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                              "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True))
        os.environ.update(PREFECT_API_URL=env["PREFECT_API_URL"])
        wait(lambda: healthy(env["PREFECT_API_URL"] + "/health"), 180, "the Prefect server")
        ui = env["PREFECT_API_URL"].removesuffix("/api")

        root = tmp / "ws"
        root.mkdir()
        settings = json.loads(json.dumps(TINY))
        settings["review"] = {"mode": "before_promotion", "timeout_s": 1200}
        (root / "params.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        subprocess.run([str(BIN / "closedloop"), "init", str(root)], cwd=root, env=env, check=True)
        subprocess.run([str(BIN / "closedloop"), "run", "-n", "0", "--no-progress"], cwd=root, env=env, check=True)
        children.append(subprocess.Popen([str(BIN / "closedloop"), "serve", "--workspace", str(root)], cwd=tmp,
                                         env={**env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

        from prefect.client.schemas.filters import FlowFilter, FlowFilterName
        from prefect.deployments import run_deployment
        from prefect.flow_runs import resume_flow_run

        def deployment():
            try:
                return api(lambda c: c.read_deployment_by_name("closedloop-iteration/iteration"))
            except Exception:
                return None

        iteration = wait(deployment, 120, "the served deployments")
        # Run → Custom run: the params form, filled from the workspace's params.yaml.
        shoot(f"{ui}/deployments/deployment/{iteration.id}/run", out / "prefect-deployment.png", height=1300)

        def paused_review():
            runs = api(lambda c: c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["closedloop-review"]))))
            return next((run for run in runs if run.state and run.state.is_paused()), None)

        # Iteration 1: the gate waits for the review; its form in the UI, then answered through the API.
        first = run_deployment("closedloop-iteration/iteration", timeout=0)
        paused = wait(paused_review, 900, "the review to pause with its form", every=2)
        shoot(f"{ui}/runs/flow-run/{paused.id}", out / "review-form.png", steps=[open_review_form], height=1300)
        sample = [json.loads(line) for line in (root / "data/batch/review_sample.jsonl").read_text().splitlines()]
        answers = {"reviewer": "ada"}
        for row in sample:
            right = row["verifier"]["passed"]
            answers[row["sample_id"]] = {"score": 1.0 if right else 0.0, "label": "correct" if right else "wrong",
                                         "comment": "checked by hand"}
        resume_flow_run(paused.id, run_input=answers)
        wait(lambda: (s := api(lambda c: c.read_flow_run(first.id)).state).is_final() and s, 900, "iteration 1")
        # Iteration 2, with a partial override from the run's form: nobody reviews; it goes on after 5 s.
        second = run_deployment("closedloop-iteration/iteration", timeout=0,
                                parameters={"params": {"review": {"timeout_s": 5}}})
        wait(lambda: (s := api(lambda c: c.read_flow_run(second.id)).state).is_final() and s, 900, "iteration 2")

        artifact = api(lambda c: c.read_latest_artifacts())
        gate = next(a for a in artifact if a.key == "gate-iteration-2")
        shoot(f"{ui}/artifacts/artifact/{gate.latest_id}", out / "gate-artifact.png", height=1300)

        # The tiny policy scores 0 everywhere: the chart is drawn from the workspace a `make run` left,
        # when one is named, else from this one.
        store = mlflow_from / "mlflow.db" if mlflow_from else root / "mlflow.db"
        port = free_port()
        children.append(subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri",
                                          f"sqlite:///{store}", "--host", "127.0.0.1", "--port", str(port)],
                                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True))
        wait(lambda: healthy(f"http://127.0.0.1:{port}/health"), 180, "the MLflow server")
        import mlflow

        experiment = mlflow.MlflowClient(f"sqlite:///{store}").get_experiment_by_name("closedloop")
        shoot(f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs?compareRunsMode=CHART",
              out / "mlflow-pass-at-1.png", steps=[pass_at_1_charts], height=1100, settle_s=6)
        print(f"tour: the workspace is {root}; finished at {datetime.now(timezone.utc):%H:%M} UTC")
        return 0
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/ui"),
                  Path(sys.argv[2]).resolve() if len(sys.argv) > 2 else None))
