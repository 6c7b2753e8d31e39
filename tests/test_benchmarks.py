import json

from benchmarks import kernels as kernel_bench


def test_kernel_benchmark_dry_run(tmp_path):
    kernel_bench.main(["--dry-run", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "kernels-dry-run.json").read_text())
    assert result["dry_run"] and result["window_scores"] and result["indexed_attention"]
    share = result["rescore_share"]["share"]
    assert set(share) == {"16", "32", "64", "128", "256", "512", "1024"}
    assert share["16"] > share["1024"] > 0
