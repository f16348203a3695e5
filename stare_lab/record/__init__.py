"""Layer 1, the run record: its files and formats (status, metrics, checkpoints, evaluations, kept batches),
and the records read as tables. May import core and stats.

The run record (docs/run_record.md): its file names and every reader and writer of it.

Runner, worker, evaluation, tracking, analysis, sweep status and search all go through this
package, so a file name or format lives in one place. It imports no torch, transformers or trl:
`sweep status` and the analysis read records in milliseconds.

One module per part of a run's folder, read in this order:

- files: the file names, where run folders are, and what every part uses (times, an error's first
  line, a damaged file set aside);
- status: status.json (state, attempts, error) and the claim of the worker executing the run;
- metrics: metrics.jsonl, one row per logged step;
- checkpoints: the trainer checkpoints a run resumes from, and the world size that wrote them;
- eval_results: the evaluation results, one per benchmark, settings and step;
- provenance: what code ran each attempt (and which weights, for a model converted from a packaged file).

Writes are atomic (temp file + rename) except metrics.jsonl, which is appended one fsync'ed row
per step; its readers tolerate a torn last row. A record that can not be parsed is never taken
for a missing one: `read_status` answers a `corrupt` state naming the problem, and the metrics
scan returns the unreadable lines beside the good rows.

The names below are the record's public API: import them from `stare_lab.record`.
"""

from stare_lab.record.checkpoints import (
    checkpoint_problem,
    checkpoint_step,
    checkpoint_world_size,
    checkpoints,
    last_checkpoint,
    process_count,
    process_rank,
)
from stare_lab.record.eval_results import (
    EVAL_SETTINGS,
    RESULT_SETTINGS,
    SAMPLE_COLUMNS,
    SETTING_DEFAULTS,
    eval_files,
    eval_metric,
    eval_result_path,
    find_eval_result,
    problem_counts,
    read_eval_results,
    result_setting,
    same_settings,
    settings_key,
    write_eval_result,
)
from stare_lab.record.files import (
    CHECKPOINT_DIR,
    CLAIM_FILE,
    CONFIG_FILE,
    EVAL_DIR,
    FINAL_DIR,
    METRICS_FILE,
    RULE_STATE_FILE,
    STATUS_FILE,
    TASK_FILE,
    WANDB_DIR,
    RecordError,
    bad_copy_path,
    elapsed,
    find_run_dirs,
    first_line,
    now_iso,
    read_json,
    set_aside,
    write_task_record,
)
from stare_lab.record.metrics import (
    append_metrics,
    metrics_path,
    read_metric_values,
    read_metrics,
    scan_metrics,
    truncate_metrics,
    write_metrics,
)
from stare_lab.record.provenance import (
    MODEL_SOURCE_FILE,
    PROVENANCE_PACKAGES,
    code_version,
    provenance,
    read_model_source,
)
from stare_lab.record.status import (
    CORRUPT,
    STATES,
    RunClaim,
    claim_held,
    flock_held,
    new_status,
    read_status,
    run_label,
    update_status,
    write_status,
)

__all__ = [
    "CHECKPOINT_DIR",
    "CLAIM_FILE",
    "CONFIG_FILE",
    "CORRUPT",
    "EVAL_DIR",
    "EVAL_SETTINGS",
    "FINAL_DIR",
    "METRICS_FILE",
    "MODEL_SOURCE_FILE",
    "PROVENANCE_PACKAGES",
    "RESULT_SETTINGS",
    "RULE_STATE_FILE",
    "SAMPLE_COLUMNS",
    "SETTING_DEFAULTS",
    "STATES",
    "STATUS_FILE",
    "TASK_FILE",
    "WANDB_DIR",
    "RecordError",
    "RunClaim",
    "append_metrics",
    "bad_copy_path",
    "checkpoint_problem",
    "checkpoint_step",
    "checkpoint_world_size",
    "checkpoints",
    "claim_held",
    "code_version",
    "elapsed",
    "eval_files",
    "eval_metric",
    "eval_result_path",
    "find_eval_result",
    "find_run_dirs",
    "first_line",
    "flock_held",
    "last_checkpoint",
    "metrics_path",
    "new_status",
    "now_iso",
    "process_count",
    "problem_counts",
    "process_rank",
    "provenance",
    "read_eval_results",
    "read_json",
    "read_metric_values",
    "read_metrics",
    "read_model_source",
    "read_status",
    "result_setting",
    "run_label",
    "same_settings",
    "scan_metrics",
    "set_aside",
    "settings_key",
    "truncate_metrics",
    "update_status",
    "write_eval_result",
    "write_metrics",
    "write_status",
    "write_task_record",
]
