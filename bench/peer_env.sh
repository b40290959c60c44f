#!/usr/bin/env bash
# The peer Ultralytics environment that bench/ultralytics_*.py run in and bench/recipe_benchmark.py and
# bench/bench_dataloader.py call: a virtual environment of its own in DIR, never this repo's (ultralytics is not a
# dependency of this repo), set up to run offline.
#
#   bench/peer_env.sh DIR            # once; then: export PEER_PYTHON=DIR/bin/python
#
# DIR/yolo-config is Ultralytics' config dir (YOLO_CONFIG_DIR): the bench scripts find it from the python they run
# in (sys.prefix), so only the python has to be named. PYTHON=python3.12 bench/peer_env.sh DIR picks the interpreter.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: bench/peer_env.sh DIR  (DIR: a new or earlier folder, outside this repository, for the venv)" >&2
    exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd -P)"
existed=$([ -e "$1" ] && echo yes || echo no)
mkdir -p "$1"
dir="$(cd "$1" && pwd -P)"
case "$dir/" in
    "$repo"/*)  # ruff, git and the tests would walk through its site-packages
        [ "$existed" = no ] && rmdir "$dir"
        echo "peer_env.sh: $1 is inside the repository; pick a folder outside it, e.g. ../peer-env" >&2
        exit 2 ;;
esac

"${PYTHON:-python3}" -m venv "$dir"
"$dir/bin/pip" install -q --upgrade pip
# The versions that bench/RESULTS.md measured; torch pinned so that a newer one cannot move the timings.
"$dir/bin/pip" install -q torch==2.14.1 torchvision==0.29.1 ultralytics==8.4.190 \
    onnx onnxruntime onnxslim pycocotools openvino nncf lap  # lap: its ByteTrack (bench/track_benchmark.py)

config="$dir/yolo-config"
mkdir -p "$config/Ultralytics"
# Every dataset check looks for Arial.ttf in the config dir and downloads it when missing (offline: fails); any TTF
# under that name will do, and matplotlib, which ultralytics installs, ships DejaVuSans.
font="$("$dir/bin/python" -c 'import matplotlib, os; print(os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSans.ttf"))')"
cp "$font" "$config/Ultralytics/Arial.ttf"
# Settings once, offline: no analytics sync and no logger integrations that would import or phone anything.
YOLO_CONFIG_DIR="$config" YOLO_OFFLINE=1 "$dir/bin/yolo" settings sync=False clearml=False comet=False dvc=False \
    mlflow=False raytune=False tensorboard=False wandb=False >/dev/null

echo "peer environment ready: export PEER_PYTHON=$dir/bin/python (its config dir, $config, is found from it)"
