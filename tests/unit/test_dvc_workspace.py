"""DvcWorkspace without os.chdir, its stage check, reading an experiment's files with their hashes
checked, and the clean-up after a killed `dvc exp save`.

Real git and DVC on temporary workspaces; the killed saves are real `dvc exp save` processes,
SIGKILLed at the step named (found by watching the repository), not recreated by hand, except where
a test says so."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from closedloop import workspace as paths
from closedloop.io import write_json, write_jsonl
from closedloop.lineage.dvc import EXP_SAVE_RECORD, DvcWorkspace
from closedloop.lineage.gitstate import DvcError
from closedloop.pipeline import STAGES
from closedloop.workspace import Workspace

TRAIN_ROWS = [{"source": "positive", "prompt": f"p{i}", "completion": f"c{i}", "origin": f"t{i}#0"} for i in range(3)]
EXPERIMENT = "iter-001-0123abcd"


def git(root: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
    if check and result.returncode:
        raise AssertionError(f"git {' '.join(args)}: {result.stderr}")
    return result.stdout.strip()


def record_iteration(root: Path, train_rows=TRAIN_ROWS) -> DvcWorkspace:
    """Every stage of dvc.yaml recorded with small stand-in outputs (what `dvc exp save` needs: it
    commits every stage), the champion added; no model is trained."""
    from closedloop.versioning.loop import close_loop

    dvc = DvcWorkspace(root)
    for spec in STAGES:
        for out in spec.outs:
            path = root / out
            if out == paths.TRAIN_SET:
                write_jsonl(path, train_rows)
            elif out.endswith(".jsonl"):
                write_jsonl(path, [{"stage": spec.name}])
            elif out.endswith(".json"):
                write_json(path, {"stage": spec.name})
            else:  # a directory: a model folder as save_policy leaves it, or the validation report
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True)
                (path / "config.json").write_text(json.dumps({"stage": spec.name}))
                (path / "model.safetensors").write_bytes(hashlib.sha256(spec.name.encode()).digest() * 512)
        if spec.name == "warmstart":
            close_loop(Workspace.at(root))  # the champion: an input of the stages after
        for small in (*spec.metrics, *spec.files):  # metrics, timing, info and plot files: outs too
            write_json(root / small, {})
        dvc.commit(spec.name)
    return dvc


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A workspace with every stage recorded, saved as experiment EXPERIMENT and pushed."""
    import yaml

    from closedloop.scaffold import init_workspace
    from tests.conftest import TINY

    root = tmp_path_factory.mktemp("saved") / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    init_workspace(root)
    dvc = record_iteration(root)
    dvc.exp_save(EXPERIMENT)
    dvc.push()
    return root


@pytest.fixture
def ws(saved, tmp_path) -> Path:
    """A private copy of ``saved``: `cp -a` keeps the hard links between its files and its cache."""
    copy = tmp_path / "ws"
    subprocess.run(["cp", "-a", str(saved), str(copy)], check=True)
    return copy


def cache_object(root: Path, md5: str) -> Path:
    return root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def corrupt(path: Path) -> None:
    """Write garbage into ``path`` in place, as a bad disk or a writer ignoring the rule would: every
    hard link to it (the workspace file, the cache object) changes with it."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as file:
        file.write(b'{"\\x": garbage')


@pytest.mark.slow  # every DvcWorkspace method, experiments included, twice: about 90 s on 2 cores
class TestNoChdir:
    @pytest.mark.parametrize("cwd_kind", [
        "plain",  # a directory that is no repository
        "other workspace",  # another DVC workspace: DVC must not resolve anything against it
    ])
    def test_every_method_works_from_another_directory(self, ws, saved, tmp_path, monkeypatch, cwd_kind) -> None:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        cwd = elsewhere if cwd_kind == "plain" else saved
        monkeypatch.chdir(cwd)
        seen: set[str] = set()
        stop = threading.Event()

        def watch() -> None:  # a Prefect task thread would see the process's cwd change
            while not stop.is_set():
                seen.add(os.getcwd())
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        saved_lock = (saved / "dvc.lock").read_text()
        try:
            dvc = DvcWorkspace(ws)
            (ws / "data" / "extra.txt").write_text("extra\n")
            dvc.add("data/extra.txt")
            assert (ws / "data" / "extra.txt.dvc").exists() and not (cwd / "data" / "extra.txt.dvc").exists()

            write_json(ws / paths.GATE, {"promote": False})
            assert "gate" in dvc.status()  # keys relative to the workspace, not to the cwd
            assert dvc.stage_up_to_date("gate") is False
            dvc.commit("gate")
            assert dvc.stage_up_to_date("gate") is True
            assert "gate" not in dvc.status() and "data/extra.txt.dvc" not in dvc.status()

            assert dvc.push() >= 1  # extra.txt and the new gate.json
            assert (ws / ".dvc-remote").is_dir()
            reference = dvc.reference("data/extra.txt")
            restored = dvc.restore(reference, "restore/extra.txt")
            assert restored == ws / "restore" / "extra.txt" and restored.read_text() == "extra\n"

            assert [json.loads(line) for line in dvc.read_at(paths.TRAIN_SET, EXPERIMENT).splitlines()] == TRAIN_ROWS
            rev = dvc.exp_save("iter-002-fedcba98")
            assert rev == dvc.experiment_rev("iter-002-fedcba98")
            assert dvc.clean_interrupted_git_state() == []
            (ws / "data" / "extra.txt").unlink()
            (ws / "data" / "extra.txt").write_text("changed\n")
            assert "data/extra.txt.dvc" in dvc.status()  # a .dvc file's stage, named from the workspace
        finally:
            stop.set()
            watcher.join()
        assert seen == {str(cwd)}
        assert (saved / "dvc.lock").read_text() == saved_lock  # the workspace at the cwd was left alone

    def test_init_stores_the_remote_relative_to_dvc_dir(self, tmp_path, monkeypatch) -> None:
        from closedloop.scaffold import init_workspace

        monkeypatch.chdir(tmp_path)
        root = init_workspace(tmp_path / "deep" / "ws")
        assert "url = ../.dvc-remote" in (root / ".dvc" / "config").read_text()
        assert DvcWorkspace(root).remote_url() == str(root / ".dvc-remote")


class TestStageUpToDate:
    @pytest.mark.parametrize("change, stage, expected", [
        (None, "benchmark", True),  # recorded, nothing changed
        (None, "promote", True),  # the last stage too
        ("param", "benchmark", False),  # project.seed, a param the stage lists, changed
        ("param", "gate", True),  # ... which gate does not list
        ("out deleted", "grade", False),  # an output missing
        ("out changed", "grade", False),  # an output rewritten
        ("dep changed", "reward", False),  # an input (samples.jsonl) rewritten
        ("unrecorded", "generate", False),  # dvc.lock has no record of it
        (None, "no-such-stage", False),  # neither dvc.yaml nor dvc.lock knows it
    ])
    def test_table(self, ws, change, stage, expected) -> None:
        import yaml

        if change == "param":
            params = yaml.safe_load((ws / "params.yaml").read_text())
            params["project"]["seed"] += 1
            (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        elif change == "out deleted":
            (ws / paths.TRAIN_SET).unlink()
        elif change == "out changed":
            write_jsonl(ws / paths.TRAIN_SET, [{"other": 1}])
        elif change == "dep changed":
            write_jsonl(ws / paths.SAMPLES, [{"other": 1}])
        elif change == "unrecorded":
            lock = yaml.safe_load((ws / "dvc.lock").read_text())
            del lock["stages"]["generate"]
            (ws / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
        started = time.perf_counter()
        assert DvcWorkspace(ws).stage_up_to_date(stage) is expected
        print(f"stage_up_to_date({stage!r}) [{change}]: {(time.perf_counter() - started) * 1000:.0f} ms")


class TestReadAt:
    def test_a_corrupt_object_is_fetched_again_from_the_remote(self, ws, caplog) -> None:
        dvc = DvcWorkspace(ws)
        md5 = dvc.recorded_out(paths.TRAIN_SET, version=EXPERIMENT)["md5"]
        corrupt(cache_object(ws, md5))
        with caplog.at_level("WARNING", logger="closedloop.lineage.dvc"):
            text = dvc.read_at(paths.TRAIN_SET, EXPERIMENT)
        assert [json.loads(line) for line in text.splitlines()] == TRAIN_ROWS
        assert "fetched a good copy from the remote" in caplog.text
        assert hashlib.md5(cache_object(ws, md5).read_bytes()).hexdigest() == md5

    def test_with_no_good_copy_the_error_names_experiment_file_and_object(self, ws) -> None:
        dvc = DvcWorkspace(ws)
        md5 = dvc.recorded_out(paths.TRAIN_SET, version=EXPERIMENT)["md5"]
        corrupt(cache_object(ws, md5))
        corrupt(ws / ".dvc-remote" / "files" / "md5" / md5[:2] / md5[2:])
        with pytest.raises(DvcError) as error:
            dvc.read_at(paths.TRAIN_SET, EXPERIMENT)
        message = str(error.value)
        assert f"experiment {EXPERIMENT!r}, {paths.TRAIN_SET}" in message
        assert str(cache_object(ws, md5)) in message and "corrupt" in message
        assert "holds a corrupt copy too" in message

    def test_a_file_of_a_directory_output_and_an_unknown_experiment(self, ws) -> None:
        dvc = DvcWorkspace(ws)
        assert json.loads(dvc.read_at(paths.CANDIDATE + "/config.json", EXPERIMENT)) == {"stage": "train"}
        with pytest.raises(DvcError, match="no DVC experiment named 'iter-999-nothere'"):
            dvc.read_at(paths.TRAIN_SET, "iter-999-nothere")
        unrecorded = f"experiment {EXPERIMENT!r}, data/nothing.jsonl: the experiment does not record"
        with pytest.raises(DvcError, match=unrecorded):
            dvc.read_at("data/nothing.jsonl", EXPERIMENT)


# -- a killed `dvc exp save` ------------------------------------------------------------------------
SAVE = """
import sys
from closedloop.lineage.dvc import DvcWorkspace
DvcWorkspace(sys.argv[1]).exp_save(sys.argv[2])
"""


def _detached(root: Path) -> bool:
    return not (root / ".git" / "HEAD").read_text().startswith("ref:")


WHEN = {  # where to kill the save: a condition on the repository, and the leftover it shows
    # the changes stashed, HEAD detached at the baseline (DVC's stash of the workspace for its queue)
    "stashed": lambda root: _detached(root) and (root / ".git" / "refs" / "stash").exists(),
    # the executor at work: EXEC_MERGE set, HEAD detached (the save about to commit)
    "executing": lambda root: _detached(root) and (root / ".git" / "refs" / "exps" / "exec" / "EXEC_MERGE").exists(),
    # the experiment committed, the executor's clean-up not done: HEAD detached at the experiment
    "committed": lambda root: _detached(root) and any((root / ".git" / "refs" / "exps").glob(f"??/*/iter-002-*")),
}


def kill_save_when(root: Path, when: str, name: str = "iter-002-fedcba98", tries: int = 4) -> None:
    """Run DvcWorkspace.exp_save in a process and SIGKILL it and its `dvc exp save` child as soon as
    WHEN[when] holds; try again (after a clean-up) when the save ran past that step before the kill."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _ in range(tries):
        process = subprocess.Popen([sys.executable, "-c", SAVE, str(root), name], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        parent = psutil.Process(process.pid)
        while process.poll() is None and not WHEN[when](root):
            time.sleep(0.0005)
        family = [parent, *parent.children(recursive=True)] if process.poll() is None else []
        for member in family:
            member.send_signal(signal.SIGKILL)
        process.wait()
        psutil.wait_procs(family, timeout=10)
        if family and WHEN[when](root):
            return
        DvcWorkspace(root).clean_interrupted_git_state()
    pytest.skip(f"could not kill a save at {when!r} in {tries} tries (the machine ran it past that step)")


@pytest.mark.slow  # real `dvc exp save` runs killed at each step: about 90 s on 2 cores
class TestCleanAfterAKilledSave:
    @pytest.mark.parametrize("when", list(WHEN))
    def test_a_real_killed_save_is_undone(self, ws, when) -> None:
        import yaml

        dvc = DvcWorkspace(ws)
        baseline = git(ws, "rev-parse", "HEAD")
        # the next iteration's state: params.yaml (tracked) changed, a file the user staged
        params = yaml.safe_load((ws / "params.yaml").read_text())
        params["loop"] = {**params.get("loop", {}), "iteration": 2}
        (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        changed = (ws / "params.yaml").read_text()
        (ws / "notes.txt").write_text("mine\n")
        git(ws, "add", "notes.txt")
        first = git(ws, "for-each-ref", "--format=%(refname) %(objectname)", f"refs/exps/*/*/{EXPERIMENT}")

        kill_save_when(ws, when)
        assert (ws / EXP_SAVE_RECORD).exists() and _detached(ws)
        if when == "stashed":
            assert git(ws, "stash", "list")  # the iteration's params.yaml is in git's stash now
        experiments = git(ws, "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/??")

        done = dvc.clean_interrupted_git_state()
        print(f"killed at {when!r}, cleaned:", *done, sep="\n  ")

        assert any("reattached HEAD to master" in line for line in done), done
        assert git(ws, "symbolic-ref", "HEAD") == "refs/heads/master" and git(ws, "rev-parse", "HEAD") == baseline
        assert (ws / "params.yaml").read_text() == changed
        assert git(ws, "stash", "list") == ""
        assert "notes.txt" in git(ws, "diff", "--cached", "--name-only").split()  # the user's staged file stays
        assert ".dvc/tmp/repro.dat" not in git(ws, "diff", "--cached", "--name-only").split()
        assert git(ws, "for-each-ref", "refs/exps/exec", "refs/exps/stash") == ""
        assert git(ws, "for-each-ref", "--format=%(refname) %(objectname)", f"refs/exps/*/*/{EXPERIMENT}") == first
        # experiment refs stay, the half-saved one too (EXEC_BRANCH, a symbolic ref to it, goes)
        assert git(ws, "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/??") == experiments
        assert not (ws / EXP_SAVE_RECORD).exists()
        # and the next save records this iteration's params
        rev = dvc.exp_save("iter-002-fedcba98")
        assert "iteration: 2" in git(ws, "show", f"{rev}:params.yaml")
        assert git(ws, "symbolic-ref", "HEAD") == "refs/heads/master"
        assert dvc.clean_interrupted_git_state() == []

    def test_a_save_whose_parent_was_killed_is_waited_for(self, ws) -> None:
        """SIGKILL of the Python process alone: its `dvc exp save` child runs on (and, its output pipes
        gone, gives up cleanly); the clean-up waits for it before it looks."""
        import psutil

        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        process = subprocess.Popen([sys.executable, "-c", SAVE, str(ws), "iter-002-fedcba98"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while process.poll() is None and not WHEN["stashed"](ws):
            time.sleep(0.0005)
        children = psutil.Process(process.pid).children() if process.poll() is None else []
        process.kill()
        process.wait()
        if not children:
            pytest.skip("the save ended before it could be killed")
        done = DvcWorkspace(ws).clean_interrupted_git_state()
        assert not children[0].is_running()
        assert done[0].startswith("waited ") and f"(pid {children[0].pid})" in done[0]
        assert git(ws, "symbolic-ref", "HEAD") == "refs/heads/master" and git(ws, "stash", "list") == ""
        DvcWorkspace(ws).exp_save("iter-002-fedcba98")

    def test_dvcs_leftovers_without_a_record_go_and_nothing_else(self, ws) -> None:
        """The leftovers the issue reports, made with git plumbing as a killed save leaves them (HEAD
        attached: the save was not closedloop's, so there is no record of it)."""
        head = git(ws, "rev-parse", "HEAD")
        (ws / ".dvc" / "tmp" / "repro.dat").write_bytes(b"packed args")
        git(ws, "add", "-f", ".dvc/tmp/repro.dat")
        (ws / "notes.txt").write_text("mine\n")
        git(ws, "add", "notes.txt")
        for ref in ("EXEC_HEAD", "EXEC_MERGE", "EXEC_BASELINE", "EXEC_APPLY"):
            git(ws, "update-ref", f"refs/exps/exec/{ref}", head)
        exp_ref = git(ws, "for-each-ref", "--format=%(refname)", f"refs/exps/*/*/{EXPERIMENT}")
        git(ws, "symbolic-ref", "refs/exps/exec/EXEC_BRANCH", exp_ref)  # as DVC sets it: to the experiment
        git(ws, "update-ref", "--create-reflog", "refs/exps/stash", head)
        experiments = git(ws, "for-each-ref", "refs/exps/??")

        done = DvcWorkspace(ws).clean_interrupted_git_state()

        assert sorted(done) == sorted([
            "unstaged .dvc/tmp/repro.dat (DVC's packed arguments, not part of the workspace)",
            "removed ref refs/exps/exec/EXEC_BASELINE", "removed ref refs/exps/exec/EXEC_BRANCH",
            "removed ref refs/exps/exec/EXEC_HEAD", "removed ref refs/exps/exec/EXEC_MERGE",
            "dropped refs/exps/stash (DVC's workspace queue: 1 entry of saves that never ran)",
        ])
        assert git(ws, "diff", "--cached", "--name-only").split() == ["notes.txt"]
        assert git(ws, "for-each-ref", "--format=%(refname)", "refs/exps/exec") == "refs/exps/exec/EXEC_APPLY"
        assert git(ws, "for-each-ref", "refs/exps/??") == experiments
        assert DvcWorkspace(ws).clean_interrupted_git_state() == []

    def test_a_detached_head_without_a_record_is_an_error_that_says_what_to_do(self, ws) -> None:
        head = git(ws, "rev-parse", "HEAD")
        git(ws, "checkout", "-q", "--detach")
        git(ws, "update-ref", "refs/exps/exec/EXEC_MERGE", head)
        with pytest.raises(DvcError, match=r"HEAD is detached .* `git checkout master`"):
            DvcWorkspace(ws).clean_interrupted_git_state()
        git(ws, "update-ref", "-d", "refs/exps/exec/EXEC_MERGE")
        assert DvcWorkspace(ws).clean_interrupted_git_state() == []  # a detached HEAD of the user's own

    def test_stale_rwlock_entries_go(self, ws) -> None:
        """A pid in .dvc/tmp/rwlock that now belongs to another process (as in a fresh container) makes
        DVC refuse ("is busy"); a dead pid DVC drops itself, with a warning. Both go."""
        rwlock = ws / ".dvc" / "tmp" / "rwlock"
        out = str(ws / paths.GATE)
        other = subprocess.Popen(["sleep", "60"])

        def leave(**entries) -> None:
            rwlock.write_text(json.dumps({"read": {}, "write": {}, **entries}))
            os.utime(rwlock, (time.time() - 5, time.time() - 5))  # written before that process started

        try:
            reused = {out: [{"pid": other.pid, "cmd": "dvc commit (its pid now someone else's)"}]}
            leave(read=reused)
            with pytest.raises(Exception, match="is busy"):
                DvcWorkspace(ws).commit("gate")
            leave(read=reused, write={out: {"pid": 2 ** 22 + 7, "cmd": "dvc repro (dead)"}})
            done = DvcWorkspace(ws).clean_interrupted_git_state()
            assert len(done) == 2 and all("no longer running" in line for line in done), done
            DvcWorkspace(ws).commit("gate")
            assert not any(json.loads(rwlock.read_text()).values())
        finally:
            other.kill()
            other.wait()

    def test_an_rwlock_file_cut_short_is_reset(self, ws) -> None:
        """Killed while DVC rewrote it, .dvc/tmp/exps/rwlock is left empty, and every later
        `dvc exp save` fails ("JSON structure is corrupted") until it is reset."""
        rwlock = ws / ".dvc" / "tmp" / "exps" / "rwlock"
        rwlock.parent.mkdir(parents=True, exist_ok=True)
        rwlock.write_text("")
        with pytest.raises(DvcError, match="JSON structure is corrupted"):
            DvcWorkspace(ws).exp_save("iter-002-fedcba98")
        assert DvcWorkspace(ws).clean_interrupted_git_state() == [
            "reset .dvc/tmp/exps/rwlock: a process killed while writing it left it unreadable (0 bytes), "
            "and DVC refuses the commands it guards until then"]
        DvcWorkspace(ws).exp_save("iter-002-fedcba98")

    def test_a_reflog_lock_the_killed_save_left_goes_with_its_stash_entry(self, ws) -> None:
        """Killed while scmrepo rewrote `git stash`'s reflog, a save leaves .git/logs/refs/stash.lock
        (seen on CI): `git stash drop` then fails "File exists" until it goes."""
        from closedloop.lineage.gitstate import record_git_state

        (ws / "params.yaml").write_text((ws / "params.yaml").read_text() + "# the next iteration\n")
        changed = (ws / "params.yaml").read_text()
        record = {**record_git_state(ws, []), "started": time.time() - 1}
        (ws / EXP_SAVE_RECORD).write_text(json.dumps(record))
        git(ws, "stash", "push", "-q")  # DVC's stash of the workspace: "WIP on master"
        git(ws, "checkout", "-q", "--detach")
        (ws / ".git" / "logs" / "refs" / "stash.lock").write_text("")

        done = DvcWorkspace(ws).clean_interrupted_git_state()

        assert any(line.startswith("removed .git/logs/refs/stash.lock") for line in done), done
        assert any(line.startswith("dropped the git stash entry") for line in done), done
        assert git(ws, "stash", "list") == "" and git(ws, "symbolic-ref", "HEAD") == "refs/heads/master"
        assert (ws / "params.yaml").read_text() == changed
