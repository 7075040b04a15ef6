"""examples/pytorch_ddp.py end to end (2 processes, gloo, two epochs, a fixed 15 ms threshold:
the tuner's own choice depends on the machine's timing): the paired, interleaved comparison it
prints is made of what it claims. Its speed numbers are measured in README's table, not
asserted here (timing goals live in benchmarks)."""

import json
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest

import dropcompute

import launch  # python/tests/launch.py: the one worker launcher

REPO = Path(__file__).resolve().parent.parent.parent
TRAIN_ROWS, EPOCHS, N, M = 1437, 2, 2, 8


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """One run of the example (block 2: blocks of more than one step are exercised), its JSON,
    stdout and log folder."""
    tmp = tmp_path_factory.mktemp("example")
    out = tmp / "example.json"
    p = launch.run_workers(REPO / "examples" / "pytorch_ddp.py",
                           ["--epochs", str(EPOCHS), "--threshold-ms", "15", "--block", "2",
                            "--log-dir", str(tmp / "logs"), "--out", str(out)], nproc=N)
    assert p.returncode == 0, f"{p.args}:\n{p.stdout}\n{p.stderr}"
    return {"r": json.loads(out.read_text()), "stdout": p.stdout, "logs": tmp / "logs"}


def test_the_ddp_example_computes_every_sample_once_per_epoch_in_both_runs(example: Dict[str, Any]) -> None:
    r, logs = example["r"], example["logs"]
    for run in ("baseline", "dropcompute"):
        # The dealer re-queues every micro-batch not started: both arms compute each sample once
        # per epoch (the last micro-batch of an epoch may be short).
        assert r[run]["samples"] == TRAIN_ROWS * EPOCHS, (run, r[run])
    assert r["baseline"]["drop_rate"] == 0.0 == r["plain"]["drop_rate"], r
    assert r["threshold_ns"] == 15_000_000, r
    # A run that drops needs more steps for the same samples.
    assert r["dropcompute"]["drop_rate"] > 0.0, r
    assert r["dropcompute"]["steps"] > r["baseline"]["steps"], r
    # The plain arm runs the full steps only: 2 epochs of ceil(1437 / 4) = 360 micro-batches,
    # 16 a step: 45 full steps, the baseline's 45 of 45 (720 micro-batches fill them exactly).
    assert r["full_steps"] == 2 * 360 // (N * M) == r["plain"]["steps"], r
    # Rank 1 of 2 sleeps 20 ms in a quarter of its micro-batches: past a 15 ms deadline it drops
    # the rest of its step, so the replay of the baseline arm's compute logs predicts drops too.
    assert 0.0 < r["predicted"]["drop_rate"] < 0.5, r
    assert {p.name for p in logs.iterdir()} == {"rank0.csv", "rank1.csv", "dropcompute_rank0.csv",
                                                "dropcompute_rank1.csv"}
    # The DropCompute arm's own logs: its steps and its drops (every rank's rows of a step).
    dc = dropcompute.simulate([str(logs / f"dropcompute_rank{k}.csv") for k in range(N)], dropcompute.Policy())
    assert len(dc["baseline_per_step_ns"]) == r["dropcompute"]["steps"], (len(dc["baseline_per_step_ns"]), r)
    assert "predicted: ratio" in example["stdout"], example["stdout"]
    assert "threshold-off overhead" in example["stdout"], example["stdout"]
    # The overhead's two readings (total time over the full steps; median of the paired steps'
    # ratios) come from every arm's per-step times, one per step it ran.
    for name in ("plain", "baseline", "dropcompute"):
        assert len(r["arms"][name]["step_ms"]) == r[name]["steps"], name
        assert all(t > 0.0 for t in r["arms"][name]["step_ms"]), name
    assert math.isfinite(r["overhead"]) and math.isfinite(r["overhead_paired"]), r
    # The drop guard is on by default, at --max-drop-rate: the steps it held the threshold off are
    # counted, measured and predicted (the replay of the baseline arm's logs runs the guard too).
    g = r["drop_guard"]
    # --threshold-ms given: no tuning run, so no tuner settings are recorded.
    assert g["bound"] == 0.10 and g["steps"] == r["dropcompute"]["steps"] and g["tuned_with_guard"] is False, g
    assert r["jitter_ms"] is None, r["jitter_ms"]
    assert 0 <= g["held_off_steps"] <= g["steps"] and 0 <= r["predicted"]["held_off_steps"], (g, r["predicted"])
    # The paired check: the prediction against the DropCompute arm's first k steps (k = the
    # baseline steps it replays, step s of both drawing the same delays), recomputed here from
    # every arm's per-step samples (the count collective's sums) and times.
    paired, arms = r["predicted"]["paired"], r["arms"]
    k = paired["steps"]
    assert k == r["baseline"]["steps"] < r["dropcompute"]["steps"], (paired, r["baseline"], r["dropcompute"])
    assert sum(arms["baseline"]["samples"]) == r["baseline"]["samples"], arms["baseline"]["samples"]
    assert sum(arms["dropcompute"]["samples"]) == r["dropcompute"]["samples"], arms["dropcompute"]["samples"]
    # Plain DDP has no count collective: its per-step counts are null, never a number.
    assert set(arms["plain"]["samples"]) == {None} == set(arms["plain"]["started"]), arms["plain"]
    # Micro-batches started: the baseline every one it was handed (N·M in each full step).
    assert arms["baseline"]["started"][:r["full_steps"]] == [N * M] * r["full_steps"], arms["baseline"]["started"]
    # In the replay's units: micro-batches started over N·M per replayed step, times the
    # baseline's time over the DropCompute arm's, over the same k steps.
    dc, base = arms["dropcompute"], arms["baseline"]
    want = sum(dc["started"][:k]) / (k * N * M) * sum(base["step_ms"][:k]) / sum(dc["step_ms"][:k])
    assert math.isclose(paired["ratio"], want, rel_tol=1e-9), (paired, want)
    assert math.isclose(paired["error"], r["predicted"]["ratio"] / paired["ratio"] - 1.0, rel_tol=1e-9), paired
    # The guard's decision per step, as the run took it: its held-off steps are the count above,
    # and over the replayed steps the paired count.
    assert dc["guard_enforced"].count(False) == g["held_off_steps"], dc
    assert dc["guard_enforced"][:k].count(False) == paired["held_off_steps"], (dc, paired)
    assert f"over the {k} replayed steps measured {paired['ratio']:.3f}" in example["stdout"], example["stdout"]
    assert f"threshold held off in {g['held_off_steps']} of {g['steps']} steps" in example["stdout"], example["stdout"]


def test_the_interleaved_arms_see_the_same_delay_keys_and_data_order(example: Dict[str, Any]) -> None:
    r = example["r"]
    arms = r["arms"]
    plain, base, dc = (arms[a] for a in ("plain", "baseline", "dropcompute"))
    for k in range(N):
        # The same dealing: plain DDP and the threshold-off baseline are handed the same sample
        # ids in the same order every step; the DropCompute arm's first step too (it differs
        # after its first drop: the not-started micro-batches are dealt again first).
        assert plain["ids_digest"][k] == base["ids_digest"][k][:len(plain["ids_digest"][k])], k
        assert dc["ids_digest"][k][0] == base["ids_digest"][k][0], k
        # The same keyed delays: plain and baseline launch every micro-batch of the full steps
        # and draw the same delay in each slot; the DropCompute arm's launches of step s are a
        # prefix of the baseline's (it stops early), slot for slot the same draws.
        assert plain["delays_ms"][k] == base["delays_ms"][k][:r["full_steps"]], k
        shared = min(len(dc["delays_ms"][k]), len(base["delays_ms"][k]))
        for s in range(shared):
            d, b = dc["delays_ms"][k][s], base["delays_ms"][k][s]
            assert d == b[:len(d)], (k, s, d, b)
    # Rank 0 is never slowed; rank 1 is, in about a quarter of its slots (20 ms each), and the
    # DropCompute arm stopped early in some step (the shorter prefixes above are real drops).
    assert all(v == 0.0 for step in base["delays_ms"][0] for v in step)
    slow = [v for step in base["delays_ms"][1] for v in step]
    assert 0.1 < sum(v == 20.0 for v in slow) / len(slow) < 0.4, slow
    assert any(len(d) < M for d in dc["delays_ms"][1]), dc["delays_ms"][1]


def test_the_interleaved_schedule_advances_the_arms_together(example: Dict[str, Any]) -> None:
    r = example["r"]
    schedule: List[Any] = r["schedule"]
    names = ["plain", "baseline", "dropcompute"]
    # Every arm's blocks follow its steps in order, at most --block (2) steps each, and together
    # cover all its steps.
    for name in names:
        mine = [(first, steps) for arm, first, steps, _ in schedule if arm == name]
        assert [f for f, _ in mine] == [sum(s for _, s in mine[:i]) for i in range(len(mine))], (name, mine)
        assert all(1 <= s <= 2 for _, s in mine), (name, mine)
        assert sum(s for _, s in mine) == r[name]["steps"], (name, mine)
    # Each block went to the arm furthest behind (micro-batches started by every rank) among the
    # arms still running (those with a later block); ties in an order drawn per block, so each
    # arm follows more than one other arm (a fixed order put every step of an arm after the
    # same arm).
    for i, (arm, _, _, progress) in enumerate(schedule):
        live = {a for a, *_ in schedule[i:]}
        chosen = names.index(arm)
        for j, name in enumerate(names):
            if name in live:
                assert progress[chosen] <= progress[j], (i, schedule[i], name)
    follows = {(a[0], b[0]) for a, b in zip(schedule, schedule[1:]) if a[0] != b[0]}
    for name in names:
        assert len({p for p, n in follows if n == name}) == 2, (name, follows)
    # The DropCompute arm's extra steps are spread over the run, not run last: after the plain
    # and baseline arms' last blocks it runs at most a few steps.
    last_other = max(i for i, (arm, *_) in enumerate(schedule) if arm != "dropcompute")
    tail = sum(steps for arm, _, steps, _ in schedule[last_other + 1:])
    assert tail <= 4, (tail, schedule[last_other:])
    # Each arm's compute log runs on the arm's own clock (its pauses removed): the replay of the
    # baseline arm's logs gives its measured step time (the step overhead derived from clock
    # starts is its own; with the other arms' blocks inside, it would be about 3x).
    b = dropcompute.simulate([str(example["logs"] / f"rank{k}.csv") for k in range(N)], dropcompute.Policy())
    assert len(b["baseline_per_step_ns"]) == r["baseline"]["steps"], r
    assert abs(b["baseline_step_ns"] / 1e6 / r["baseline"]["step_ms"] - 1.0) < 0.1, (b["baseline_step_ns"], r)


@pytest.mark.parametrize("value, expected", [("15", 15.0), ("0.5", 0.5), ("off", "off"), (None, None)])
def test_the_example_reads_its_threshold_flag(value: Any, expected: Any) -> None:
    # A number of ms, "off" (an A/A run: both arms threshold off, the protocol's own noise), or
    # absent (recommended from the tuning run).
    ex = _example_module()
    argv = [] if value is None else ["--threshold-ms", value]
    assert ex.parse_args(argv).threshold_ms == expected


def test_the_example_runs_the_drop_guard_unless_told_not_to() -> None:
    ex = _example_module()
    assert ex.parse_args([]).drop_guard is True
    assert ex.parse_args(["--no-drop-guard"]).drop_guard is False
    # The tuner scores with the guard it runs, within a 1 ms jitter window, unless told.
    assert ex.parse_args([]).tune_with_guard is True
    assert ex.parse_args(["--no-tune-with-guard"]).tune_with_guard is False
    assert ex.parse_args([]).jitter_ms == 1.0 and ex.parse_args(["--jitter-ms", "0"]).jitter_ms == 0.0


@pytest.mark.parametrize("argv", [["--threshold-ms", "x"], ["--threshold-ms", "0"], ["--threshold-ms", "-3"],
                                  ["--block", "0"], ["--slow-prob", "1.5"], ["--jitter-ms", "-1"],
                                  ["--jitter-ms", "nan"], ["--jitter-ms", "inf"]])
def test_the_example_refuses_a_bad_flag_naming_it(argv: List[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _example_module().parse_args(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def _example_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("pytorch_ddp_example", REPO / "examples" / "pytorch_ddp.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("parts", [False, True])
def test_the_overhead_bench_pairs_the_modes_in_one_launch(parts: bool, tmp_path: Path) -> None:
    """examples/bench_torch_overhead.py --mode paired (README's threshold-off table): plain DDP
    and the three modes, auto resolved (with --parts also a second plain DDP arm and DDP plus the count collective) step in
    one launch, and the JSON bench_torch_targets.py reads holds each arm's median step time and
    each other arm's paired overhead over DDP, a ratio of two positive times."""
    out = tmp_path / "paired.json"
    p = launch.run_workers(REPO / "examples" / "bench_torch_overhead.py",
                           ["--params", "2e4", "--mode", "paired", "--steps", "6", "--out", str(out)]
                           + (["--parts"] if parts else []), nproc=2)
    assert p.returncode == 0, f"{p.args}:\n{p.stdout}\n{p.stderr}"
    r = json.loads(out.read_text())
    assert r["mode"] == "paired" and r["steps"] == 3, r  # the first 3 of 6 not timed
    assert r["params"] == sum(3 * (w * w + w) for w in [int((2e4 / 3) ** 0.5)]), r
    others = ["flat", "overlap", "auto"] + (["ddp_again", "ddp_counts"] if parts else [])
    # 2e4 parameters (78 KiB of gradients) sit below DDP's 25 MiB bucket: auto runs flat.
    assert r["auto_resolved"] == "flat", r
    assert sorted(k[:-len("_step_ms")] for k in r if k.endswith("_step_ms")) == sorted(["ddp"] + others), r
    for m in ["ddp"] + others:
        assert r[f"{m}_step_ms"] > 0, r
    for m in others:
        assert math.isfinite(r[f"{m}_overhead_paired"]) and r[f"{m}_overhead_paired"] > -1.0, r


def test_the_example_tunes_with_its_guard_and_jitter_window_from_its_own_tuning_logs(tmp_path: Path) -> None:
    # No --threshold-ms: a tuning run first, then recommend over its logs with the guard in the
    # score and the 1 ms window (the defaults); every rank decides alike. The threshold the run
    # used is the crate's verdict recomputed here from the tuning logs the example kept.
    out, logs = tmp_path / "tuned.json", tmp_path / "logs"
    p = launch.run_workers(REPO / "examples" / "pytorch_ddp.py",
                           ["--epochs", "1", "--log-dir", str(logs), "--out", str(out)], nproc=N)
    assert p.returncode == 0, f"{p.args}:\n{p.stdout}\n{p.stderr}"
    r = json.loads(out.read_text())
    assert r["drop_guard"]["tuned_with_guard"] is True and r["jitter_ms"] == 1.0, r["drop_guard"]
    v = dropcompute.recommend([logs / f"tune_rank{k}.csv" for k in range(N)], check="before", max_drop_rate=0.10,
                              drop_guard=True, jitter_ns=1e6)
    assert r["threshold_ns"] == v.threshold_ns, (r["threshold_ns"], v)
    assert f"threshold: {v!r} (from the tuning run's logs)" in p.stdout, p.stdout
