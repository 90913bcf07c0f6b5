"""Calling precompile-serve from Python with the generated stubs.

The stubs come from the project's .proto files (bazel build //proto:python;
tools/setup.sh puts them on the virtual environment's path), so this needs
only grpcio and numpy:

    .venv/bin/python client/python/remote_call.py --address 127.0.0.1:8001

It sends one KServe v2 ModelInfer call to the bundled `mlp` example (a batch
of 8: the static variant) with the tensor in raw_input_contents, reads
output0 and how the server served the call (the response parameters
precompile_outcome and precompile_variant), then asks the admin service for
the artifact's summary.
"""

import argparse
import dataclasses
from typing import Optional

import grpc
import numpy as np

from proto import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc


@dataclasses.dataclass
class InferResult:
    output0: np.ndarray
    # "variant" (a compiled variant ran) or "eager_fallback".
    outcome: str
    # The variant that ran, e.g. "forward#0"; "" after an eager fallback.
    variant: str


def infer_mlp(channel: grpc.Channel, x: np.ndarray, timeout: float = 10.0) -> InferResult:
    """Runs the `mlp` example on `x` (float32, [batch, 4])."""
    stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
    x = np.ascontiguousarray(x, dtype="<f4")  # raw contents are little-endian, row-major
    request = inference_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    # A refusal (no captured variant matches) raises grpc.RpcError with
    # code() == grpc.StatusCode.FAILED_PRECONDITION.
    response = stub.ModelInfer(request, timeout=timeout)

    # raw_output_contents[i] holds the bytes of outputs[i].
    index = [o.name for o in response.outputs].index("output0")
    output = response.outputs[index]
    assert output.datatype == "FP32", output.datatype
    output0 = np.frombuffer(response.raw_output_contents[index], dtype="<f4").reshape(
        tuple(output.shape))
    return InferResult(
        output0=output0,
        outcome=response.parameters["precompile_outcome"].string_param,
        variant=response.parameters["precompile_variant"].string_param,
    )


def get_summary(channel: grpc.Channel, model: str, admin_token: Optional[str] = None,
                timeout: float = 10.0) -> admin_pb2.SummaryResponse:
    """The artifact's precompile summary. A server started with
    --admin_token_file wants the token as "authorization: Bearer <token>";
    without it the call fails with UNAUTHENTICATED."""
    stub = admin_pb2_grpc.PrecompileAdminStub(channel)
    metadata = [("authorization", f"Bearer {admin_token}")] if admin_token else None
    return stub.GetSummary(admin_pb2.ModelRequest(name=model), timeout=timeout,
                           metadata=metadata)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:8001")
    parser.add_argument("--admin_token_file", help="file holding the admin token, if any")
    args = parser.parse_args()
    token = None
    if args.admin_token_file:
        with open(args.admin_token_file) as f:
            token = f.read().strip()

    with grpc.insecure_channel(args.address) as channel:
        x = np.random.default_rng(0).standard_normal((8, 4), dtype=np.float32)
        result = infer_mlp(channel, x)
        print(f"output0 {result.output0.shape}: served by {result.outcome} {result.variant}")
        print(result.output0)
        summary = get_summary(channel, "mlp", token)
        print(f"summary: entry frame {summary.entry_frame}, complete={summary.complete}, "
              f"frames {list(summary.frames)}, variants {dict(summary.variants_per_frame)}")


if __name__ == "__main__":
    main()
