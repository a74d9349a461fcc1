import argparse
import json

import pytest

from grpoplus.metrics.commands import register_commands

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="grpoplus")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _config(preset, overrides):
    return {"run": {"preset": preset, "overrides": overrides}, "rollout": {"group_size": 8},
            "algo": {"preset": preset}}


def test_doctor_healthy_prints_healthy_and_exits_0(traces, tmp_path, capsys):
    run = traces.write_run(tmp_path / "ok", traces.healthy(), _config("grpo", []))
    assert run_cli("doctor", str(run)) == 0
    assert "healthy" in capsys.readouterr().out


def test_doctor_warning_exits_0_severe_exits_1(traces, tmp_path, capsys):
    warn = traces.write_run(tmp_path / "warn", traces.zero_variance(0.7))
    assert run_cli("doctor", str(warn)) == 0
    out = capsys.readouterr().out
    assert "WARNING zero_variance" in out and "evidence: groups/zero_std_frac" in out
    assert "fix: dynamic sampling" in out
    severe = traces.write_run(tmp_path / "severe", traces.nonfinite())
    assert run_cli("doctor", str(severe)) == 1
    assert "SEVERE  nonfinite_updates" in capsys.readouterr().out


def test_doctor_json_output(traces, tmp_path, capsys):
    run = traces.write_run(tmp_path / "r", traces.nonfinite())
    assert run_cli("doctor", str(run), "--json") == 1
    (finding,) = json.loads(capsys.readouterr().out)
    assert finding["code"] == "nonfinite_updates" and finding["severity"] == "severe"


def test_doctor_threshold_override_and_unknown_name(traces, tmp_path, capsys):
    run = traces.write_run(tmp_path / "zv", traces.zero_variance(0.95))
    assert run_cli("doctor", str(run)) == 1  # severe at >= 0.9
    capsys.readouterr()
    assert run_cli("doctor", str(run), "--threshold", "zero_variance_severe_frac=0.99") == 0
    assert "WARNING zero_variance" in capsys.readouterr().out
    assert run_cli("doctor", str(run), "--threshold", "zero_variance_frac=0.99",
                   "--threshold", "zero_variance_severe_frac=1.0") == 0
    assert "healthy" in capsys.readouterr().out
    assert run_cli("doctor", str(run), "--threshold", "zero_var=0.5") == 2
    err = capsys.readouterr().err
    assert "unknown doctor threshold 'zero_var=0.5'" in err and "zero_variance_frac" in err


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    assert run_cli("doctor", str(tmp_path / "nope")) == 2
    assert "run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_cli("doctor", str(tmp_path / "empty")) == 2
    assert "no metrics file" in capsys.readouterr().err
    assert run_cli("report", str(tmp_path / "empty")) == 2
    assert run_cli("compare", str(tmp_path / "empty"), "--out", str(tmp_path / "c")) == 2
    with pytest.raises(SystemExit):
        run_cli("report", str(tmp_path), "--smooth", "1.5")


def _pngs(directory):
    return {p.stem: p for p in directory.glob("*.png")}


def test_report_writes_nonempty_pngs_and_index(traces, tmp_path):
    run = traces.write_run(tmp_path / "run", traces.entropy_collapse(), _config("dapo", []))
    assert run_cli("report", str(run)) == 0
    pngs = _pngs(run / "report")
    expected = {"reward", "reward_components", "entropy", "entropy_tail", "length", "truncation",
                "clip", "ratio", "kl", "grad_norm", "mismatch", "zero_variance", "batch", "time",
                "throughput"}
    assert set(pngs) == expected
    for png in pngs.values():
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    page = (run / "report" / "index.html").read_text()
    assert all(f'src="{name}.png"' in page for name in expected)
    assert "entropy_collapse" in page  # the doctor's finding is on the page


def test_report_skips_panels_without_data(traces, tmp_path):
    records = [{k: v for k, v in r.items() if not k.startswith(("mismatch/", "time/"))}
               for r in traces.healthy(n=12)]
    run = traces.write_run(tmp_path / "run", records)
    assert run_cli("report", str(run)) == 0
    pngs = _pngs(run / "report")
    assert "mismatch" not in pngs and "time" not in pngs and "reward" in pngs
    page = (run / "report" / "index.html").read_text()
    assert "Panels without data" in page and "Sampler/learner mismatch" in page
    assert "healthy" in page


def test_compare_overlays_runs_with_preset_legend(traces, tmp_path):
    a = traces.write_run(tmp_path / "base", traces.healthy(), _config("grpo", []))
    b = traces.write_run(tmp_path / "higher", traces.entropy_collapse(),
                         _config("dapo", ["algo.eps_high=0.3", "run.seed=1"]))
    out = tmp_path / "cmp"
    assert run_cli("compare", str(a), str(b), "--out", str(out)) == 0
    pngs = _pngs(out)
    assert {"reward", "entropy", "length", "clip", "mismatch", "zero_variance", "time"} <= set(pngs)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in pngs.values())
    page = (out / "index.html").read_text()
    assert "base: grpo" in page and "higher: dapo algo.eps_high=0.3 run.seed=1" in page


def test_run_labels_keep_only_what_differs(tmp_path):
    from grpoplus.metrics.commands import run_labels

    common = ["run.out=/home/user/experiments/ablations/2025-06/", "rollout.prompts_per_step=32",
              "run.max_steps=300"]
    dirs = [tmp_path / n for n in ("base", "dapo_eps_high_0.3", "hi_temp", "seed1")]
    configs = [_config("grpo", common), _config("dapo", common + ["algo.eps_high=0.3"]),
               _config("dapo", common + ["rollout.temperature=1.2"]),
               _config("dapo", common + ["run.seed=1"])]
    labels = run_labels([str(d) for d in dirs], configs)
    # the shared overrides and run.out are gone; keys lose their section; the second run's
    # name already says eps_high 0.3, the fourth's its seed; runs that did not override a
    # key say nothing about it
    assert labels == ["base: grpo", "dapo_eps_high_0.3", "hi_temp: dapo temperature=1.2",
                      "seed1: dapo"]


def test_run_labels_disambiguate_equal_names_and_stay_short(tmp_path):
    from grpoplus.metrics.commands import run_labels

    dirs = [str(tmp_path / "sweep_a" / "seed0"), str(tmp_path / "sweep_b" / "seed0")]
    configs = [_config("dapo", ["data.data=/very/long/path/to/a/dataset/file_number_one.jsonl"]),
               _config("dapo", ["data.data=/very/long/path/to/b/dataset/file_number_two.jsonl"])]
    a, b = run_labels(dirs, configs)
    assert a.startswith("sweep_a/seed0: data=") and b.startswith("sweep_b/seed0: data=")
    assert a != b and len(a) <= 48 and "…" in a
