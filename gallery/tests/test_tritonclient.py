"""tritonclient, the standard KServe v2 client, calls the gallery's BERT
unchanged: keyword arguments as named inputs, outputs by name.

Its own generated protos share the package name `inference` with the
project's, so this file runs in a process of its own.
"""

import numpy as np
import torch
import tritonclient.grpc as triton
from conftest import eager, tokens

from gallery import models


def test_tritonclient_calls_bert_unchanged(server):
    client = triton.InferenceServerClient(server.address)
    ids, mask = tokens(2, 13, seed=4)
    inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"),
              triton.InferInput("attention_mask", list(mask.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    result = client.infer("bert", inputs, outputs=[triton.InferRequestedOutput("last_hidden_state")])
    want = eager(models.make_bert, input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(result.as_numpy("last_hidden_state"), want.last_hidden_state.numpy(),
                               rtol=1e-4, atol=1e-4)
    assert result.as_numpy("pooler_output") is None


def test_tritonclient_reads_readiness_and_metadata(server):
    client = triton.InferenceServerClient(server.address)
    assert client.is_server_ready() and client.is_model_ready("resnet18")
    meta = client.get_model_metadata("resnet18")
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == [("x", "FP32", [-1, 3, 224, 224])]
    assert [(o.name, list(o.shape)) for o in meta.outputs] == [("output0", [-1, 1000])]
