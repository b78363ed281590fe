"""One copy of the weights: the DVC cache links into the workspace, writers never change a linked file
in place, and a registered model version references DVC's bytes instead of holding its own.

Real git, DVC and MLflow on temporary workspaces; no mocks."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from closedloop import workspace as paths
from closedloop.io import replace_dir, write_json, write_jsonl
from closedloop.lineage.dvc import LINK_CACHE_TYPES, DvcWorkspace
from closedloop.pipeline import stage_spec
from closedloop.workspace import Workspace

WEIGHTS = "model.safetensors"


def hardlinks_work(where: Path) -> bool:
    source = where / ".probe-src"
    source.write_bytes(b"x")
    try:
        os.link(source, where / ".probe-dst")
        (where / ".probe-dst").unlink()
        return True
    except OSError:
        return False
    finally:
        source.unlink()


def model_dir(path: Path, seed: int) -> Path:
    """A model folder as save_policy leaves it (config, weights, tokenizer), random weights."""
    import random

    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}\n')
    (path / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (path / WEIGHTS).write_bytes(random.Random(seed).randbytes(300_000))
    return path


def save_like_a_stage(ws_path: Path, seed: int) -> None:
    """As the warmstart and train stages save: into <name>.staging, then a rename over the old folder."""
    staging = ws_path.with_name(ws_path.name + ".staging")
    model_dir(staging, seed)
    shutil.rmtree(ws_path, ignore_errors=True)
    staging.rename(ws_path)


def commit_stage(root: Path, stage: str, outputs: dict[str, object] | None = None) -> None:
    """Record ``stage`` as run_recorded does, with stand-ins for the data inputs it does not get here."""
    for dep in stage_spec(stage).deps:
        if not (root / dep).exists():
            write_jsonl(root / dep, [{"stand_in": dep}]) if dep.endswith(".jsonl") else write_json(root / dep, {})
    for relative, data in (outputs or {}).items():
        (write_jsonl if relative.endswith(".jsonl") else write_json)(root / relative, data)
    for small in (*stage_spec(stage).metrics, *stage_spec(stage).files):  # metrics, timing, info, plots
        write_json(root / small, {})
    DvcWorkspace(root).commit(stage)


def cache_object(root: Path, file: Path) -> Path:
    digest = hashlib.md5(file.read_bytes()).hexdigest()
    return root / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]


def corrupt_objects(store: Path) -> list[str]:
    """Objects (files and .dir listings) of a DVC cache or local remote whose bytes no longer hash to
    their name: what writing a linked file in place would leave (DVC does not rehash read-only objects)."""
    bad = []
    for path in (store / "files" / "md5").rglob("*"):
        if path.is_file():
            name = path.parent.name + path.name.removesuffix(".dir")
            if hashlib.md5(path.read_bytes()).hexdigest() != name:
                bad.append(str(path.relative_to(store)))
    return bad


def warm_start(root: Path) -> DvcWorkspace:
    """The warm start's versioning: the stage output committed, the champion made from it (close_loop)."""
    from closedloop.versioning.loop import close_loop

    commit_stage(root, "benchmark", {paths.BENCHMARK_TASKS: [{"task_id": "t0"}]})
    save_like_a_stage(root / paths.WARMSTART_MODEL, seed=0)
    commit_stage(root, "warmstart", {paths.REFERENCES: [{"task_id": "t0"}], paths.WARMSTART_EVAL: {}})
    close_loop(Workspace.at(root))
    return DvcWorkspace(root)


class TestCacheType:
    def test_init_sets_a_linking_cache_type_for_this_machine(self, workspace) -> None:
        chosen = DvcWorkspace(workspace).cache_type()
        assert chosen in LINK_CACHE_TYPES.values()
        if hardlinks_work(workspace):
            assert chosen in (LINK_CACHE_TYPES["reflink"], LINK_CACHE_TYPES["hardlink"])
        assert "type" in (workspace / ".dvc" / "config.local").read_text()  # machine-local, not committed
        assert "cache" not in (workspace / ".dvc" / "config").read_text()

    def test_a_cache_type_the_user_set_stays(self, workspace) -> None:
        from closedloop.scaffold import init_workspace

        subprocess.run([sys.executable, "-m", "dvc", "config", "cache.type", "copy"], cwd=workspace, check=True)
        subprocess.run([sys.executable, "-m", "dvc", "config", "--local", "--unset", "cache.type"], cwd=workspace,
                       check=True)
        init_workspace(workspace)
        assert DvcWorkspace(workspace).cache_type() == "copy"

    def test_init_of_a_workspace_made_before_links_relinks_its_copies(self, workspace) -> None:
        from closedloop.scaffold import init_workspace

        if not hardlinks_work(workspace):
            pytest.skip("no hard links on this file system")
        # as an older closedloop left it: no cache.type (DVC copies), a model folder added
        subprocess.run([sys.executable, "-m", "dvc", "config", "--local", "--unset", "cache.type"], cwd=workspace,
                       check=True)
        model_dir(workspace / paths.CHAMPION, seed=3)
        subprocess.run([sys.executable, "-m", "dvc", "add", "-q", paths.CHAMPION], cwd=workspace, check=True)
        weights = workspace / paths.CHAMPION / WEIGHTS
        assert weights.stat().st_ino != cache_object(workspace, weights).stat().st_ino  # two copies

        init_workspace(workspace)

        assert DvcWorkspace(workspace).cache_type() == LINK_CACHE_TYPES["hardlink"]
        assert weights.stat().st_ino == cache_object(workspace, weights).stat().st_ino  # one
        assert paths.CHAMPION + ".dvc" not in DvcWorkspace(workspace).status()  # nothing changed but the links


class TestOneCopy:
    def test_versions_share_inodes_with_the_cache_and_stay_intact(self, workspace) -> None:
        from closedloop.versioning.loop import close_loop
        from closedloop.config import load_params
        from closedloop.stages.recorded import run_recorded

        if not hardlinks_work(workspace):
            pytest.skip("no hard links on this file system")
        root, ws = workspace, Workspace.at(workspace)
        dvc = warm_start(root)
        warm = root / paths.WARMSTART_MODEL / WEIGHTS
        warm_bytes = warm.read_bytes()
        inode = cache_object(root, warm).stat().st_ino
        # the stage output, the champion made from it and the cache object: one file
        assert warm.stat().st_ino == (root / paths.CHAMPION / WEIGHTS).stat().st_ino == inode
        assert warm.stat().st_nlink == 3 and stat.S_IMODE(warm.stat().st_mode) == 0o444  # read-only

        dvc.push()
        remote = root / ".dvc-remote"
        pushed = remote / cache_object(root, warm).relative_to(root / ".dvc" / "cache")
        assert pushed.read_bytes() == warm_bytes and pushed.stat().st_ino != inode  # the one other copy

        # iteration 1: train writes the candidate, promote makes it the next champion, close_loop the champion
        save_like_a_stage(root / paths.CANDIDATE, seed=1)
        commit_stage(root, "train", {paths.TRAIN_ROUNDS: []})
        write_json(ws.gate, {"promote": True})
        commit_stage(root, "gate")
        run_recorded("promote", root, load_params(root))
        close_loop(ws)
        dvc.push()

        candidate = root / paths.CANDIDATE / WEIGHTS
        assert candidate.stat().st_ino == (root / paths.NEXT_CHAMPION / WEIGHTS).stat().st_ino \
            == (root / paths.CHAMPION / WEIGHTS).stat().st_ino == cache_object(root, candidate).stat().st_ino
        # the champion of iteration 0 was replaced, not written into: its cached bytes are whole
        assert cache_object(root, warm).stat().st_ino == inode and warm.read_bytes() == warm_bytes
        assert corrupt_objects(root / ".dvc" / "cache") == [] and corrupt_objects(remote) == []
        # the workspace holds each version once, whatever its apparent size
        inodes = {p.stat().st_ino for p in root.glob("data/**/" + WEIGHTS)}
        assert len(list(root.glob("data/**/" + WEIGHTS))) == 4 and len(inodes) == 2

    def test_replace_dir_links_and_leaves_the_old_files_alone(self, tmp_path) -> None:
        if not hardlinks_work(tmp_path):
            pytest.skip("no hard links on this file system")
        first, second, dst = model_dir(tmp_path / "a", 0), model_dir(tmp_path / "b", 1), tmp_path / "dst"
        replace_dir(first, dst)
        assert (dst / WEIGHTS).stat().st_ino == (first / WEIGHTS).stat().st_ino
        before = (first / WEIGHTS).read_bytes()
        replace_dir(second, dst)
        assert (dst / WEIGHTS).read_bytes() == (second / WEIGHTS).read_bytes()
        assert (first / WEIGHTS).read_bytes() == before  # what dst linked to is untouched
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "dst"]  # no .staging / .old left


class TestRegistryByReference:
    def test_a_version_holds_a_reference_that_gets_the_weights_back(self, workspace, tmp_path) -> None:
        mlflow = pytest.importorskip("mlflow")
        from closedloop.lineage import tracking
        from closedloop.models.loading import model_fingerprint

        root = workspace
        saved_uri = mlflow.get_tracking_uri()
        try:
            dvc = warm_start(root)
            dvc.push()
            tracking.configure(root, None, "closedloop-test")
            run_id = tracking.log_iteration(iteration=0, run_name="warm", params={}, metrics={}, tags={},
                                            rewards=[], datasets=[], artifacts=[], stage_seconds={})
            reference = dvc.reference(paths.WARMSTART_MODEL)
            assert reference["md5"] == dvc.lock_hashes()[paths.WARMSTART_MODEL] and reference["md5"].endswith(".dir")
            version = tracking.log_and_register_model(
                run_id=run_id, model_dir=root / paths.WARMSTART_MODEL, registered_model="policy",
                tags={"iteration": "0"}, reference=reference)
            tracking.set_alias("policy", "champion", version)

            # no weights in MLflow's store: only the reference and the pointer file
            stored = [p for p in (root / "mlartifacts").rglob("*") if p.is_file()]
            assert not {p.name for p in stored} & {WEIGHTS, "config.json", "tokenizer.json"}
            assert sum(p.stat().st_size for p in stored) < 10_000
            assert tracking.model_version_tags("policy", version) == {"iteration": "0"}

            # the reference brings the weights back: from the cache, and from the remote without it
            expected = model_fingerprint(root / paths.WARMSTART_MODEL)
            ref = tracking.model_reference("policy", "champion")
            assert ref["md5"] == reference["md5"] and ref["workspace"] == str(root)
            restored = DvcWorkspace(ref["workspace"]).restore(ref, "restore/champion")
            assert model_fingerprint(restored) == expected
            assert not (root / "restore" / "champion.dvc").exists()  # the pointer does not stay behind
            shutil.rmtree(root / ".dvc" / "cache")
            again = DvcWorkspace(root).restore(ref["md5"], "restore/from-remote")
            assert model_fingerprint(again) == expected
        finally:
            mlflow.set_tracking_uri(saved_uri)
