"""Sends N identical ModelInfer calls, one at a time, for bench/profile_hit_path.sh.

    profile_driver.py PORT MODEL SHAPE N [name=int ...]

One request at a time from a separate process, so that the server's
instruction counts per request are exact; a server under valgrind is slow to
start and to answer, so it waits up to 300 s for the server, sends one call
that must succeed, then N calls, and prints how many failed.
"""
import sys
import time

import grpc
import numpy as np

from proto import inference_pb2, inference_pb2_grpc


def main():
    port, model, shape, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    shape = [int(s) for s in shape.split(",")]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=300)
    stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = inference_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=shape)
    request.raw_input_contents.append(np.random.randn(*shape).astype("<f4").tobytes())
    for kv in sys.argv[5:]:
        k, v = kv.split("=")
        request.parameters[k].int64_param = int(v)
    deadline = time.time() + 300
    while True:  # the model may still be loading
        try:
            stub.ModelInfer(request, timeout=30)
            break
        except grpc.RpcError:
            if time.time() > deadline:
                raise
            time.sleep(1)
    errors = 0
    for _ in range(n):
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError:
            errors += 1
    print(f"profile_driver: {n} calls, {errors} failed", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
