"""Triton's system shared memory extension: regions registered, listed and dropped; inputs read from them and
outputs written into them, over HTTP and gRPC, through unmodified tritonclient and its shared memory
utilities. The differential test against the real Triton is in test_serve_vs_triton.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._serve_support import serving, shared_memory_objects, shared_memory_request, tiny_expected, tiny_repo

from hybrid.errors import ServingError
from hybrid.serve.core.protocol import Limits, encode_response, parse_request
from hybrid.serve.triton.shared_memory import SHM_ROOT, SharedMemoryRegions, Span

tg = pytest.importorskip("tritonclient.grpc")
import tritonclient.http as th  # noqa: E402
import tritonclient.utils.shared_memory as tshm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.timeout(180)

X = np.array([[1, 2, 3, 4], [-1, 0.5, 2, -3]], np.float32)
SCALE = np.full((2, 1), 0.5, np.float32)


def expect(code: str) -> pytest.RaisesContext:
    return pytest.raises(ServingError, match=code)


@pytest.fixture
def regions(tmp_path):
    """Regions over a folder of plain files: the same calls as on /dev/shm, on any machine."""
    out = SharedMemoryRegions(root=tmp_path)
    try:
        yield out
    finally:
        out.close()


def test_a_region_maps_its_span_of_the_object_and_writes_reach_the_object(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    region = regions.register("r", "/obj", 16, 32)
    assert region.as_dict() == {"name": "r", "key": "/obj", "offset": 16, "byte_size": 32}
    assert bytes(regions.read("r", 4, 8)) == bytes(range(20, 28))
    regions.write("r", 0, 4, b"\xff\xff")
    assert (tmp_path / "obj").read_bytes()[16:19] == b"\xff\xff\x12"
    assert [r.name for r in regions.status()] == ["r"] and regions.status("r") == [region]


def test_register_refuses_names_twice_keys_that_are_not_objects_and_spans_past_the_object(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(8))
    regions.register("r", "obj", 0, 8)  # glibc's shm_open takes a key with or without its '/'
    with expect("HYB-713"):
        regions.register("r", "/obj", 0, 8)
    for key in ("/missing", "/a/b", "/..", "/", 7):
        with expect("HYB-711"):
            regions.register("k", key, 0, 8)
    (tmp_path / "dir").mkdir()
    with expect("HYB-711"):
        regions.register("k", "/dir", 0, 8)
    with expect("HYB-711"):
        regions.register("k", "/obj", 4, 8)  # 12 bytes of an 8-byte object
    for offset, size in ((-1, 4), (0, 0), (0, "8"), (True, 4)):
        with expect("HYB-711"):
            regions.register("k", "/obj", offset, size)
    assert [r.name for r in regions.status()] == ["r"]


def test_the_number_of_regions_is_bounded(tmp_path):
    (tmp_path / "obj").write_bytes(bytes(8))
    regions = SharedMemoryRegions(root=tmp_path, max_regions=2)
    try:
        regions.register("a", "/obj", 0, 8)
        regions.register("b", "/obj", 0, 8)
        with pytest.raises(ServingError, match="the most this server holds"):
            regions.register("c", "/obj", 0, 8)
        regions.unregister("a")
        regions.register("c", "/obj", 0, 8)
    finally:
        regions.close()
    assert SharedMemoryRegions().max_regions >= 16


def test_spans_outside_a_region_and_unknown_regions_are_refused(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(32))
    regions.register("r", "/obj", 8, 16)
    with expect("HYB-711"):
        regions.read("r", 12, 8)
    with expect("HYB-711"):
        regions.write("r", 0, 4, b"12345")  # more than the output's byte size
    with expect("HYB-711"):
        regions.check(Span("r", 16, 1))
    for call in (lambda: regions.read("nope", 0, 1), lambda: regions.status("nope"),
                 lambda: regions.check(Span("nope", 0, 1))):
        with expect("HYB-712"):
            call()


def test_an_object_that_shrank_after_register_is_refused_rather_than_read(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(64))
    regions.register("r", "/obj", 32, 32)
    os.truncate(tmp_path / "obj", 40)  # the client shrank it: its pages past 40 bytes are gone
    with pytest.raises(ServingError, match="shrank to 40 bytes"):
        regions.read("r", 0, 4)
    with pytest.raises(ServingError, match="shrank"):
        regions.write("r", 0, 4, b"1234")


def test_unregister_drops_one_or_all_and_what_was_read_stays(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(range(16)))
    regions.register("a", "/obj", 0, 16)
    regions.register("b", "/obj", 0, 8)
    view = np.frombuffer(regions.read("a", 0, 16), np.uint8)  # what a request read before the region went
    regions.unregister("a")
    regions.unregister("zzz")  # unknown: nothing, as in Triton
    assert [r.name for r in regions.status()] == ["b"]
    assert view.tolist() == list(range(16))
    regions.unregister()
    assert regions.status() == []


def test_the_codec_reads_inputs_from_regions_and_writes_outputs_into_them(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(3) + X.tobytes() + bytes(64))
    regions.register("in", "/obj", 0, 3 + X.nbytes)
    regions.register("out", "/obj", 3 + X.nbytes, 64)
    doc = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                       "parameters": {"shared_memory_region": "in", "shared_memory_offset": 3,
                                      "shared_memory_byte_size": X.nbytes}}],
           "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64}}]}
    request = parse_request(json.dumps(doc).encode(), None, Limits(), shared_memory=regions)
    np.testing.assert_array_equal(request.inputs["x"], X)
    assert request.inputs["x"].flags.aligned
    regions.write("in", 3, X.nbytes, bytes(X.nbytes))  # the client reuses its region: the request keeps its copy
    np.testing.assert_array_equal(request.inputs["x"], X)
    body, _ = encode_response("m", "1", request, {"y": X * 2}, shared_memory=regions)
    assert json.loads(body)["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 4]}]  # no data
    np.testing.assert_array_equal(np.frombuffer(regions.read("out", 0, X.nbytes), np.float32).reshape(2, 4), X * 2)


@pytest.mark.parametrize(("change", "says"), [
    (lambda d: d["inputs"][0].update(data=[0] * 8), "more than one of"),
    (lambda d: d["inputs"][0]["parameters"].update(binary_data_size=32), "more than one of"),
    (lambda d: d["inputs"][0]["parameters"].update(shared_memory_byte_size=28), "needs 32"),
    (lambda d: d["inputs"][0]["parameters"].update(shared_memory_offset=-1), "non-negative integer"),
    (lambda d: d["inputs"][0]["parameters"].update(shared_memory_region=5), "name of a registered region"),
    (lambda d: d["outputs"][0]["parameters"].update(classification=2), "sets both"),
    (lambda d: d["outputs"][0]["parameters"].update(binary_data=True), "sets both"),
])
def test_malformed_shared_memory_parameters_are_hyb_702(regions, tmp_path, change, says):
    (tmp_path / "obj").write_bytes(bytes(64))
    regions.register("r", "/obj", 0, 64)
    doc = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                       "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 32}}],
           "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]}
    change(doc)
    with pytest.raises(ServingError) as info:
        parse_request(json.dumps(doc).encode(), None, Limits(), shared_memory=regions)
    assert info.value.code == "HYB-702" and says in info.value.message


def test_an_output_region_is_checked_before_the_model_runs(regions, tmp_path):
    (tmp_path / "obj").write_bytes(bytes(64))
    regions.register("r", "/obj", 0, 64)
    doc = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}],
           "outputs": [{"name": "y", "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 8}}]}
    with expect("HYB-712"):
        parse_request(json.dumps(doc).encode(), None, Limits(), shared_memory=regions)


# ------------------------------------------------------------------------------------------------ the server
needs_shm = pytest.mark.skipif(not SHM_ROOT.is_dir(), reason="no POSIX shared memory file system (/dev/shm)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving([tiny_repo(tmp_path_factory.mktemp("shm"))]) as srv:
        yield srv


@pytest.fixture
def objects():
    """The image (at offset 16), the scale and room for the answer, in objects a client made."""
    with shared_memory_objects({"x": 16 + X.nbytes, "s": SCALE.nbytes, "y": 64}) as made:
        tshm.set_shared_memory_region(made["x"][1], [X], offset=16)
        tshm.set_shared_memory_region(made["s"][1], [SCALE])
        yield made


@needs_shm
@pytest.mark.parametrize("module", [th, tg], ids=["http", "grpc"])
def test_inputs_and_outputs_travel_through_shared_memory(server, objects, module):
    handles = {name: handle for name, (_, handle) in objects.items()}
    url = server.url.removeprefix("http://") if module is th else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        assert "system_shared_memory" in (client.get_server_metadata() if module is th else
                                          client.get_server_metadata(as_json=True))["extensions"]
        client.register_system_shared_memory("in_x", objects["x"][0], 16 + X.nbytes)
        client.register_system_shared_memory("in_s", objects["s"][0], SCALE.nbytes)
        client.register_system_shared_memory("out_y", objects["y"][0], 64)
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory("in_x", objects["x"][0], 8)
        assert "HYB-713" in info.value.message()
        status = client.get_system_shared_memory_status() if module is th else \
            list(client.get_system_shared_memory_status(as_json=True)["regions"].values())
        assert sorted(r["name"] for r in status) == ["in_s", "in_x", "out_y"]

        inputs, outputs = shared_memory_request(module)
        result = client.infer("tiny", inputs, outputs=outputs)
        want = tiny_expected(X, SCALE)
        if module is th:  # in its region, not in the answer (tritonclient's as_numpy has nothing to read)
            assert result.get_output("y") == {"name": "y", "datatype": "FP32", "shape": [2, 3]}
        else:
            assert result.get_response().raw_output_contents[0] == b""
        np.testing.assert_allclose(tshm.get_contents_as_numpy(handles["y"], np.float32, [2, 3], offset=8), want["y"],
                                   rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("s"), want["s"], rtol=1e-6)

        mixed = [module.InferInput("x", [2, 4], "FP32"), module.InferInput("scale", [2, 1], "FP32")]
        mixed[0].set_data_from_numpy(X)
        mixed[1].set_shared_memory("in_s", SCALE.nbytes)  # one input in the request, one in a region
        np.testing.assert_allclose(client.infer("tiny", mixed).as_numpy("y"), want["y"], rtol=1e-6)

        client.unregister_system_shared_memory("in_x")
        with pytest.raises(InferenceServerException) as info:
            client.infer("tiny", inputs)
        assert "HYB-712" in info.value.message()
        client.unregister_system_shared_memory()
        status = client.get_system_shared_memory_status() if module is th else \
            client.get_system_shared_memory_status(as_json=True).get("regions", {})
        assert not status
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_a_server_without_shared_memory_says_so_and_refuses_regions(tmp_path):
    """Replicas on Ray share no memory with their clients: ServeOptions(shared_memory=False)."""
    with serving([tiny_repo(tmp_path)], shared_memory=False) as srv:
        client = th.InferenceServerClient(srv.url.removeprefix("http://"))
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory("r", "/anything", 8)
        assert info.value.status() == "400" and "HYB-711" in info.value.message()
        inputs = [th.InferInput("x", [2, 4], "FP32"), th.InferInput("scale", [2, 1], "FP32")]
        inputs[0].set_shared_memory("r", X.nbytes)
        inputs[1].set_data_from_numpy(SCALE)
        with pytest.raises(InferenceServerException) as info:
            client.infer("tiny", inputs)
        assert info.value.status() == "400" and "takes no shared memory" in info.value.message()


def test_grpc_inputs_are_copied_out_of_their_region_and_raw_contents_hold_the_others(regions, tmp_path):
    from tritonclient.grpc import service_pb2 as pb

    from hybrid.serve.grpc.server import decode_inputs

    (tmp_path / "obj").write_bytes(X.tobytes())
    regions.register("in", "/obj", 0, X.nbytes)
    request = pb.ModelInferRequest(model_name="tiny")
    x = request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    x.parameters["shared_memory_region"].string_param = "in"
    x.parameters["shared_memory_byte_size"].int64_param = X.nbytes
    request.inputs.add(name="scale", datatype="FP32", shape=[2, 1])
    request.raw_input_contents.append(SCALE.tobytes())  # the one input outside shared memory
    arrays = decode_inputs(request, Limits(), regions)
    regions.write("in", 0, X.nbytes, bytes(X.nbytes))
    np.testing.assert_array_equal(arrays["x"], X)
    np.testing.assert_array_equal(arrays["scale"], SCALE)
    request.raw_input_contents.append(SCALE.tobytes())  # one raw entry too many
    with pytest.raises(ServingError, match="1 inputs outside shared memory but 2 raw_input_contents"):
        decode_inputs(request, Limits(), regions)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=JSON, key=JSON, offset=JSON, byte_size=JSON)
def test_arbitrary_register_requests_only_ever_raise_shared_memory_errors(tmp_path, name, key, offset, byte_size):
    (tmp_path / "obj").write_bytes(bytes(16))
    regions = SharedMemoryRegions(root=tmp_path, max_regions=4)
    try:
        regions.register(name, key, offset, byte_size)
    except ServingError as e:
        assert e.code in ("HYB-711", "HYB-713")
    finally:
        regions.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(st.sampled_from(["shared_memory_region", "shared_memory_byte_size",
                                               "shared_memory_offset", "binary_data", "classification"]),
                              JSON, max_size=5))
def test_arbitrary_shared_memory_parameters_only_ever_raise_hyb_70x(tmp_path, params):
    (tmp_path / "obj").write_bytes(bytes(64))
    regions = SharedMemoryRegions(root=tmp_path)
    regions.register("r", "/obj", 0, 64)
    doc = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": params}],
           "outputs": [{"name": "y", "parameters": params}]}
    try:
        parse_request(json.dumps(doc).encode(), None, Limits(), shared_memory=regions)
    except ServingError as e:
        assert e.code in ("HYB-702", "HYB-711", "HYB-712")
    finally:
        regions.close()


@needs_shm
def test_regions_dropped_under_load_cost_only_hyb_712_never_a_wrong_answer(server):
    """Clients register, infer and unregister while another drops every region now and then."""
    import threading

    want = tiny_expected(X, SCALE)["y"]
    errors: list[str] = []
    wrong: list[np.ndarray] = []
    done = threading.Event()

    def client(i: int) -> None:
        module = tg if i % 2 else th
        c = module.InferenceServerClient(server.grpc_url if module is tg else server.url.removeprefix("http://"))
        sizes = {"x": X.nbytes, "s": SCALE.nbytes, "y": 24}
        with shared_memory_objects(sizes) as made:
            tshm.set_shared_memory_region(made["x"][1], [X])
            tshm.set_shared_memory_region(made["s"][1], [SCALE])
            names = {k: f"churn{k}{i}" for k in made}
            for _ in range(15):
                try:
                    for k, (key, _) in made.items():
                        c.register_system_shared_memory(names[k], key, sizes[k])
                    for _ in range(3):
                        inputs = [module.InferInput("x", [2, 4], "FP32"), module.InferInput("scale", [2, 1], "FP32")]
                        inputs[0].set_shared_memory(names["x"], X.nbytes)
                        inputs[1].set_shared_memory(names["s"], SCALE.nbytes)
                        y = module.InferRequestedOutput("y")
                        y.set_shared_memory(names["y"], 24)
                        tshm.set_shared_memory_region(made["y"][1], [np.zeros((2, 3), np.float32)])
                        c.infer("tiny", inputs, outputs=[y])
                        got = tshm.get_contents_as_numpy(made["y"][1], np.float32, [2, 3])
                        if not np.allclose(got, want, rtol=1e-5):
                            wrong.append(got)
                except InferenceServerException as e:
                    errors.append(e.message())
                finally:
                    for name in names.values():
                        c.unregister_system_shared_memory(name)
        c.close()

    def chaos() -> None:
        c = th.InferenceServerClient(server.url.removeprefix("http://"))
        while not done.wait(0.01):
            c.unregister_system_shared_memory()

    workers = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    dropper = threading.Thread(target=chaos)
    for t in (*workers, dropper):
        t.start()
    for t in workers:
        t.join()
    done.set()
    dropper.join()
    assert not wrong
    assert all("HYB-712" in e for e in errors), {e[:80] for e in errors}
    assert th.InferenceServerClient(server.url.removeprefix("http://")).is_server_live()
