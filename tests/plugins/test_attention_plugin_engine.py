"""An engine containing the FlashAttention plugin, built and run by datacenter TensorRT on a GPU.

No machine here can run it: TensorRT-RTX cannot host custom plugins and the H200 has no TensorRT
(architecture.md, "Verification matrix"). It runs where `tensorrt` and a GPU it supports exist.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.trt_run


def _model_bytes(b: int, h: int, s: int, d: int, causal: bool) -> bytes:
    import onnx_ir as ir

    from trtforge.plugins.attention.onnx_node import add_reference_function, make_flash_attention_node

    values = [
        ir.Value(name=n, type=ir.TensorType(ir.DataType.FLOAT16), shape=ir.Shape([b, h, s, d])) for n in "qkv"
    ]
    mask = ir.Value(name="mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([b, s]))
    node = make_flash_attention_node(*values, mask, num_heads=h, scale=d**-0.5, causal=causal, name="attn")
    node.outputs[0].name = "out"
    graph = ir.Graph([*values, mask], node.outputs, nodes=[node], opset_imports={"": 18}, name="attention")
    model = ir.Model(graph, ir_version=10)
    add_reference_function(model)
    return ir.to_proto(model).SerializeToString()


@pytest.mark.parametrize("causal", [False, True])
def test_engine_with_the_plugin_matches_onnxruntime(causal):
    import torch

    from trtforge.core.backend import get_backend
    from trtforge.numerics.sessions import exact_session
    from trtforge.plugins.attention.plugin import register_plugins

    backend = get_backend()
    if not backend.capabilities.can_host_plugins:
        pytest.skip(f"[trt_run] {backend.capabilities.plugin_reason}; needs datacenter TensorRT")
    register_plugins(backend)
    trt = backend.trt
    b, h, s, d = 2, 4, 200, 64
    onnx_bytes = _model_bytes(b, h, s, d, causal)

    builder = backend.create_builder()
    network = backend.create_network(builder)
    parser = backend.create_parser(network)
    assert parser.parse(onnx_bytes), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    layer_types = {network.get_layer(i).type for i in range(network.num_layers)}
    assert trt.LayerType.PLUGIN_V3 in layer_types, "the parser did not map the node to the plugin"
    engine_bytes = builder.build_serialized_network(network, builder.create_builder_config())
    assert engine_bytes is not None
    engine = trt.Runtime(backend.logger).deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()

    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(np.float16) for n in "qkv"}
    feeds["mask"] = np.ones((b, s), np.int64)
    feeds["mask"][1, 150:] = 0
    tensors = {name: torch.from_numpy(value).cuda() for name, value in feeds.items()}
    tensors["out"] = torch.empty(b, h, s, d, dtype=torch.float16, device="cuda")
    for name, tensor in tensors.items():
        context.set_tensor_address(name, tensor.data_ptr())
    stream = torch.cuda.current_stream()
    assert context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()

    (expected,) = exact_session(onnx_bytes).run(None, feeds)
    np.testing.assert_allclose(tensors["out"].cpu().numpy().astype(np.float32), expected, atol=3e-3)
