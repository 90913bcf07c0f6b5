"""The Python peer: a plain grpcio KServe v2 server running torch.compile.

What a user who does not use precompile-serve would likely write: the
generated stubs of proto/inference.proto (proto.inference_pb2_grpc), a
grpc.server on a thread pool, and the same model compiled with
torch.compile (Inductor, static shapes) and warmed up at start. It answers
ModelInfer with raw_input_contents -> tensor -> model -> raw_output_contents,
with the same response fields as precompile_server, so precompile_load
drives it unchanged.

MLServer and TorchServe are the usual off-the-shelf choices; neither can be
installed usefully on this offline machine (only PyPI and Debian are
reachable, and TorchServe needs Java model archives and its own frontend),
so this plain server stands in for them. It is, if anything, faster than
either: no REST layer, no worker processes, no batching queue.

    .venv/bin/python bench/python_kserve_server.py --port 18201 \
        --models mlp,medium [--workers 8] [--torch_threads 1]

Run from the repository root with PYTHONPATH holding the root (for
examples/ and bench/) and the Bazel output holding proto/*_pb2*.py.
"""

import argparse
import os
import signal
import sys
import threading
import time
import warnings
from concurrent import futures

import grpc
import numpy as np
import torch

from proto import inference_pb2, inference_pb2_grpc

# name -> (module:factory, example input shape)
MODELS = {
    "mlp": ("examples.models:make_mlp", (8, 4)),
    "medium": ("bench.models:make_medium", (32, 256)),
}

DTYPES = {"FP32": (np.float32, torch.float32)}


def load(spec):
    module, factory = spec.split(":")
    __import__(module)
    return getattr(sys.modules[module], factory)()


class Service(inference_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, models):
        self.models = models  # name -> compiled callable

    def ServerLive(self, request, context):
        return inference_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return inference_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return inference_pb2.ModelReadyResponse(ready=request.name in self.models)

    def ModelInfer(self, request, context):
        model = self.models.get(request.model_name)
        if model is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.model_name}'")
        if len(request.inputs) != 1 or len(request.raw_input_contents) != 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "one input in raw_input_contents")
        spec = request.inputs[0]
        if spec.datatype not in DTYPES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"datatype {spec.datatype}")
        np_dtype, _ = DTYPES[spec.datatype]
        array = np.frombuffer(request.raw_input_contents[0], dtype=np_dtype).reshape(
            tuple(spec.shape))
        x = torch.from_numpy(array)  # zero-copy; read-only buffer
        with torch.inference_mode():
            y = model(x)
        out = y.contiguous().numpy()
        response = inference_pb2.ModelInferResponse(
            model_name=request.model_name, model_version="1", id=request.id)
        response.parameters["precompile_outcome"].string_param = "torch_compile"
        response.parameters["precompile_variant"].string_param = ""
        response.outputs.add(name="output0", datatype=spec.datatype, shape=list(out.shape))
        response.raw_output_contents.append(out.tobytes())
        return response


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18201)
    parser.add_argument("--models", default="mlp,medium")
    parser.add_argument("--workers", type=int, default=8, help="gRPC thread pool size")
    parser.add_argument("--torch_threads", type=int, default=0)
    parser.add_argument("--mode", default="default", help="torch.compile mode")
    args = parser.parse_args()

    # np.frombuffer over the request's bytes is read-only; torch warns once.
    warnings.filterwarnings("ignore", message=".*not writable.*")
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    models = {}
    for name in args.models.split(","):
        spec, shape = MODELS[name]
        module = load(spec)
        compiled = torch.compile(module, mode=args.mode, dynamic=False)
        start = time.time()
        with torch.inference_mode():
            for _ in range(3):
                compiled(torch.randn(*shape))
        print(f"python_kserve_server: compiled {name} for {list(shape)} in "
              f"{time.time() - start:.1f} s", file=sys.stderr, flush=True)
        models[name] = compiled

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[("grpc.max_receive_message_length", 256 << 20),
                 ("grpc.max_send_message_length", 256 << 20)])
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(models), server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"python_kserve_server: listening on 127.0.0.1:{args.port} (pid {os.getpid()})",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
