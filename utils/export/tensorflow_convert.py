"""The ONNX -> TensorFlow conversion of export.py's --saved-model and --pb, run in a process of its own
(utils/export/tensorflow.py starts it with `python -c`): onnx2tf and TensorFlow set global seeds and log levels,
start thread pools and may call sys.exit on a graph they cannot take; in a child, a crash is one sentence of the
parent's and the parent stays as it was. It imports no torch, so the child starts in TensorFlow's time alone.

    convert(onnx, test_images.npy, saved_model_folder)             # a SavedModel
    convert(onnx, test_images.npy, scratch_folder, best.pb, json)  # a SavedModel in scratch, frozen into best.pb

The SavedModel's one signature, serving_default, takes "images" (batch, 3, h, w) float 0..1 like every other format
of export.py and returns {"output": ...}, the ONNX graph's output: onnx2tf builds an NHWC network and the transpose
to it is the signature's first op. The frozen GraphDef holds the same function, its input the placeholder "images"
and its output the node "output", with the metadata JSON in a Const node METADATA_NODE that nothing consumes.
"""

import contextlib
import os
import sys

import numpy as np

SIGNATURE = "serving_default"
METADATA_NODE = "yolo_flat_metadata"  # the Const node of a frozen GraphDef that holds export.py's metadata (JSON)


def prepared_onnx(onnx_path):
    """The ONNX graph as onnx2tf converts it right: shapes folded to constants and node names without a leading '/'.

    Folded (onnx_graphsurgeon, with shape inference between rounds): the head's flatten computes its shapes from
    Shape ops; through them onnx2tf loses track of the layout and concatenated boxes with scores on the wrong axis
    (output (1, 87, 4) for (1, 84, 7), measured). Renamed: onnx2tf names Keras layers by node names, and a SavedModel
    refuses variable scopes that start with '/' (YOLO26's grouped convolutions: "is not a valid root scope name")."""
    import onnx
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(onnx.load(onnx_path)))
    for _ in range(3):  # a folded shape can make the next one constant
        graph.fold_constants().cleanup()
        graph = gs.import_onnx(onnx.shape_inference.infer_shapes(gs.export_onnx(graph)))
    model = gs.export_onnx(graph)
    for node in model.graph.node:
        node.name = node.name.lstrip("/")
    return model


class _Int(int):
    """int() that takes a one-element array: onnx2tf's TopK calls int() on its K, which ONNX stores as a 1-D
    tensor of one element, and numpy 2 refuses that (TypeError: only 0-dimensional arrays can be converted; YOLO26's
    end-to-end head). A subclass, since the same module tests isinstance(k, int). Ultralytics edits onnx2tf's file
    for this; shadowing the name in that one module of the child process leaves the installed package as it is."""

    def __new__(cls, value=0):
        return int.__new__(cls, np.asarray(value).reshape(-1)[0] if isinstance(value, np.ndarray) else value)


def keras_model(onnx_path, test_images):
    """onnx2tf's Keras model of the ONNX graph. test_images (NHWC float 0..1): what onnx2tf runs the ONNX and the TF
    graphs on while it decides each op's layout; it would otherwise download sample images from GitHub, at every
    conversion and also offline (onnx2tf's download_test_image_data)."""
    import onnx2tf
    import onnx2tf.onnx2tf as converter
    import onnx2tf.ops.TopK as top_k

    converter.download_test_image_data = lambda: test_images
    top_k.int = _Int
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines are not part of export.py's report
        return onnx2tf.convert(
            onnx_graph=prepared_onnx(onnx_path),
            output_folder_path=os.getcwd(),  # the parent runs this in a scratch folder; nothing is saved there
            not_use_onnxsim=True,  # onnxsim is not needed: prepared_onnx folded the graph
            disable_model_save=True,  # saved below, with the NCHW signature, and without the .tflite files
            verbosity="error",
        )


def save(model, folder):
    """The SavedModel, its one signature taking NCHW "images". tf_keras's ExportArchive traces that signature
    only: tf.saved_model.save of the Keras model traces every layer's call too, many times slower."""
    import tensorflow as tf
    import tf_keras

    batch, h, w, channels = model.inputs[0].shape
    archive = tf_keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name=SIGNATURE,
        fn=lambda images: {"output": model(tf.transpose(images, (0, 2, 3, 1)))},
        input_signature=[tf.TensorSpec((batch, channels, h, w), tf.float32, name="images")],
    )
    with contextlib.redirect_stdout(sys.stderr):  # it prints a summary of the endpoint
        archive.write_out(folder)


def freeze(folder, pb_path, metadata_json):
    """The SavedModel's signature as a frozen GraphDef (its variables made constants), the metadata node first: a
    file cut short keeps it, and fails on a missing node instead of reading as a model from elsewhere."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    loaded = tf.saved_model.load(folder)  # kept: its signature's variables are freed with it
    serve = loaded.signatures[SIGNATURE]
    spec = serve.structured_input_signature[1]["images"]

    @tf.function(input_signature=[tf.TensorSpec(spec.shape, spec.dtype, name="images")])
    def graph(images):
        return tf.identity(serve(images=images)["output"], name="output")

    frozen = convert_variables_to_constants_v2(graph.get_concrete_function()).graph.as_graph_def()
    graph_def = tf.compat.v1.GraphDef(versions=frozen.versions, library=frozen.library)
    node = graph_def.node.add(name=METADATA_NODE, op="Const")
    node.attr["dtype"].type = tf.string.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(metadata_json.encode()))
    graph_def.node.extend(frozen.node)
    with open(pb_path, "wb") as f:
        f.write(graph_def.SerializeToString())


def convert(onnx_path, test_images_path, folder, pb_path=None, metadata_json=None):
    model = keras_model(onnx_path, np.load(test_images_path))
    save(model, folder)
    if pb_path:
        freeze(folder, pb_path, metadata_json)
