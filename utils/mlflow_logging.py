"""train.py --mlflow: the run in MLflow, where teams already compare their runs: its settings as parameters, the
results.csv columns as metrics per epoch (step = epoch), and at the end the pictures, results.csv, args.yaml and
best.pt as artifacts. Rank 0 alone logs.

Where: MLFLOW_TRACKING_URI when set (a server, a database, a folder), else a local file store beside the run
folders: runs/train/mlruns for runs/train/exp (the run folder's parent / mlruns), one store for the runs of a
project. mlflow-skinny is enough (the client and the file store; `mlflow ui` to browse them needs the full
`mlflow`). mlflow is imported only here and only with --mlflow: it is optional.

A resumed run continues the same MLflow run: its id is kept in the run folder (mlflow.json), beside last.pt.
"""

import json
import math
import os
import time
from pathlib import Path

MLFLOW_MISSING = "--mlflow needs MLflow, which is not installed: pip install mlflow-skinny (or leave out --mlflow)"
MAX_PARAMS_PER_CALL = 100  # MLflow's limit for one log_batch


def mlflow_installed():
    """Whether mlflow imports; train.py asks before anything is written, and stops with MLFLOW_MISSING if not."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return False
    return True


def local_store(run_dir):
    """The default tracking URI: a file store beside the run folder (runs/train/mlruns for runs/train/exp)."""
    return (Path(run_dir).resolve().parent / "mlruns").as_uri()


class MlflowRun:
    """One training run's MLflow run, through MlflowClient (no global active run that an embedding program
    might also use). Start it with start_mlflow_run."""

    def __init__(self, client, run_id):
        self.client, self.run_id = client, run_id

    def log_epoch(self, values, epoch):
        """One results.csv row ({column: value}) at step `epoch`. An epoch without validation has NaN metrics:
        left out, so that the charts join the epochs that have them. A resumed run that trains an epoch again
        (killed after its row, before last.pt) adds a second point at that step: MLflow's history only grows."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, epoch) for k, v in values.items() if not math.isnan(float(v))]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, run_dir):
        """The run's pictures, results.csv, args.yaml and weights/best.pt as artifacts; the run marked finished.
        Not last.pt: three times best.pt's size (optimizer state, both weights), and only a resume needs it, which
        needs the run folder anyway."""
        run_dir = Path(run_dir)
        for path in sorted([*run_dir.glob("*.png"), *run_dir.glob("*.jpg")]):
            self.client.log_artifact(self.run_id, str(path), "plots")
        for name in ("results.csv", "args.yaml"):
            self.client.log_artifact(self.run_id, str(run_dir / name))
        self.client.log_artifact(self.run_id, str(run_dir / "weights" / "best.pt"), "weights")
        self.client.set_terminated(self.run_id, "FINISHED")


def start_mlflow_run(run_dir, settings):
    """The MLflow run of this training run: a new one, with `settings` (train.py's resolved arguments) as its
    parameters, or, when the run folder already has one (a resume), that one, continued. The MLflow experiment is
    named after the dataset yaml (shapes for data/shapes.yaml), or MLFLOW_EXPERIMENT_NAME when set."""
    run_dir = Path(run_dir)
    record = run_dir / "mlflow.json"
    saved = json.loads(record.read_text()) if record.exists() else None
    uri = saved["tracking_uri"] if saved else os.environ.get("MLFLOW_TRACKING_URI") or local_store(run_dir)
    if uri.startswith("file:") or "://" not in uri:
        # Recent MLflow refuses its file store unless asked for: it is kept (maintenance mode), new features go
        # to database stores, which need SQLAlchemy and a database. A folder of plain files suits a local run.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    params = {k: "" if v is None else str(v) for k, v in settings.items()}
    if saved:
        run_id = saved["run_id"]
        logged = client.get_run(run_id).data.params
        # parameters cannot change in MLflow: what a resume changed (--epochs to extend, the devices) goes to tags
        for k, v in params.items():
            if k in logged and logged[k] != v:
                client.set_tag(run_id, f"resumed.{k}", v)
        params = {k: v for k, v in params.items() if k not in logged}
        client.update_run(run_id, "RUNNING")
    else:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or Path(settings["data"]).stem
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        run_id = client.create_run(
            experiment_id, run_name=run_dir.name, tags={"run_dir": str(run_dir.resolve())}
        ).info.run_id
        record.write_text(json.dumps({"tracking_uri": uri, "run_id": run_id}))
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), MAX_PARAMS_PER_CALL):
        client.log_batch(run_id, params=items[i : i + MAX_PARAMS_PER_CALL])
    return MlflowRun(client, run_id)
