"""The HybridError hierarchy and the catalog of stable error codes.

Every failure a user can cause raises a :class:`HybridError` with a stable code (``HYB-4xx``), a
one-line message that says what was expected and what was found, and a hint that says what to do.
The code's hundreds digit names the area (DESIGN 2.8); :func:`explain` returns the long text that
``pyasc explain CODE`` prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CATALOG",
    "FIXES",
    "BackendError",
    "BundleError",
    "ConfigError",
    "ErrorInfo",
    "HybridError",
    "ModelError",
    "QuantizationError",
    "RunError",
    "ServingError",
    "explain",
    "first_line",
]


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """One row of the catalog: a short title and the long explanation."""

    title: str
    explanation: str


CATALOG: dict[str, ErrorInfo] = {
    # 1xx configuration
    "HYB-101": ErrorInfo("unknown configuration key",
                         "A key given to hybrid.init, set_backend or compile(config=...) is not one hybrid "
                         "knows. The message lists the valid keys at that level; check the spelling."),
    "HYB-102": ErrorInfo("invalid configuration value",
                         "A configuration value has the wrong type or lies outside its allowed range or "
                         "choices. The message names the key, the expected values and what was given."),
    "HYB-103": ErrorInfo("invalid size",
                         "A size such as a memory-pool limit must be a non-negative integer number of bytes "
                         "or a string like '512MB', '4GB', '1.5GiB'."),
    "HYB-104": ErrorInfo("invalid log level",
                         "set_log_level takes DEBUG, INFO, WARNING, ERROR or CRITICAL (any case) or an int."),
    # 2xx model / IR / export
    "HYB-201": ErrorInfo("model file not found",
                         "The path given as a model does not exist or is not a file."),
    "HYB-202": ErrorInfo("model cannot be parsed",
                         "The bytes are not a valid serialized ONNX ModelProto (or the file is truncated)."),
    "HYB-203": ErrorInfo("unsupported model source",
                         "Models load from a path, bytes, an onnx.ModelProto, an onnx_ir.Model or a "
                         "hybrid.Model. Export torch modules first with hybrid.export."),
    "HYB-204": ErrorInfo("unsafe external data reference",
                         "A tensor stored as external data points outside the model's folder (an absolute "
                         "path, '..' or a symbolic link that escapes). hybrid refuses to read it; move the "
                         "data file next to the model and fix the 'location' entry."),
    "HYB-205": ErrorInfo("invalid model graph",
                         "The graph breaks an ONNX rule hybrid relies on (a value used before it is "
                         "defined, duplicate names, a missing external data file)."),
    "HYB-206": ErrorInfo("export failed",
                         "torch could not export the module to ONNX. The message carries torch's own error "
                         "and the module path where it failed."),
    "HYB-207": ErrorInfo("frontend library missing",
                         "This operation needs a library that is not installed (for example torch for "
                         "hybrid.export). Install the matching extra: pip install 'pyasc[torch]'."),
    "HYB-208": ErrorInfo("optimization pass failed",
                         "A graph pass raised or produced an invalid graph. The message names the pass; "
                         "run with a lower optimize level or disable that pass in the config."),
    "HYB-209": ErrorInfo("cannot make batch dynamic",
                         "The model's batch dimension is baked into the graph in a way hybrid cannot "
                         "rewrite. The message names the node that pins the batch size."),
    "HYB-210": ErrorInfo("invalid export arguments",
                         "hybrid.export was given arguments it cannot use (shapes, names, dynamic axes), or an "
                         "opset_version the exporter cannot write for this module (the dynamo exporter writes "
                         "opset 18 and up; an older one is converted with onnx.version_converter where it can be)."),
    "HYB-211": ErrorInfo("unknown zoo model",
                         "hybrid.zoo.build was given a name the zoo does not have. The message lists the "
                         "names (hybrid.zoo.NAMES)."),
    # 3xx device / backend / compile
    "HYB-301": ErrorInfo("unknown target",
                         "A target is 'auto', a device ('cpu', 'gpu', 'cuda:1', 'npu'), a backend "
                         "('reference', 'onnxruntime', 'openvino', 'torch', 'tensorrt') or "
                         "'backend:device'. The message lists the targets available on this machine."),
    "HYB-302": ErrorInfo("backend not available",
                         "The requested backend's library is not installed or failed to load. `pyasc devices` "
                         "shows why; install it (for example pip install 'pyasc[openvino]')."),
    "HYB-303": ErrorInfo("device not present",
                         "The requested device does not exist on this machine, or no available backend can "
                         "use it. The message lists the devices that are present."),
    "HYB-304": ErrorInfo("cannot compile (or not at that precision)",
                         "The backend could not compile the model (an unsupported operator, opset or dtype), "
                         "or does not offer the precision asked for (fp16, bf16) on that device. The message "
                         "carries the backend's own reason; try another target, another precision or 'auto'."),
    "HYB-305": ErrorInfo("operator not supported by any backend",
                         "No available backend supports one of the model's nodes. Register a custom op "
                         "with @hybrid.custom_op or install a backend that has it."),
    "HYB-306": ErrorInfo("invalid backend options",
                         "An option given to a backend (set_backend or compile config) is unknown or has a "
                         "bad value. The message lists the options that backend accepts."),
    "HYB-307": ErrorInfo("device fallback refused",
                         "The requested device is absent and the device_fallback policy is 'error'. Set "
                         "hybrid.init({'device_fallback': 'warn'}) to fall back to what is present."),
    # 4xx run inputs and runtime
    "HYB-401": ErrorInfo("missing input",
                         "A required model input was not given. The message names it and lists the inputs "
                         "the model takes."),
    "HYB-402": ErrorInfo("unknown input name",
                         "An input was given under a name the model does not have. The message lists the "
                         "model's inputs."),
    "HYB-403": ErrorInfo("wrong input dtype",
                         "An input array has a different dtype than the model declares. Cast it, e.g. "
                         "x.astype(np.float32)."),
    "HYB-404": ErrorInfo("wrong input rank",
                         "An input array has a different number of dimensions than the model declares."),
    "HYB-405": ErrorInfo("input dimension mismatch",
                         "A static dimension of an input differs from the model's, or two inputs disagree "
                         "on the size of one symbolic dimension."),
    "HYB-406": ErrorInfo("input is not an array",
                         "Inputs must be numpy arrays (or objects convertible with numpy.asarray, such as "
                         "torch tensors on the CPU)."),
    "HYB-407": ErrorInfo("wrong number of inputs",
                         "More positional inputs were given than the model has inputs."),
    "HYB-408": ErrorInfo("backend run failed",
                         "The backend raised while running the model. The message carries its error."),
    "HYB-409": ErrorInfo("kernel failed on a node",
                         "A reference kernel rejected its inputs (a shape the operator forbids, for "
                         "example). The message names the node and the operator."),
    "HYB-410": ErrorInfo("memory pool exhausted",
                         "The memory pool arena has no free block large enough. Raise the pool size in "
                         "hybrid.init({'memory_pool': {...}}) or free tensors; the message gives the "
                         "request size and the largest free block."),
    "HYB-411": ErrorInfo("timed out",
                         "A request waited longer than its timeout (in a batching queue, a pipeline or a "
                         "stream)."),
    "HYB-412": ErrorInfo("queue full",
                         "The request queue reached max_queue; the request was rejected instead of letting "
                         "the queue grow. Retry later or raise max_queue."),
    "HYB-413": ErrorInfo("batched function broke its contract",
                         "A @dynamic_batch function must return a list with one result per request; it "
                         "returned something else. Every caller of that batch gets this error. A served model "
                         "that batches (max_batch_size > 0) must return every output with the batch's rows "
                         "first, as Triton reads it; an output without them fails the requests of its run."),
    "HYB-414": ErrorInfo("cancelled",
                         "The request was cancelled before it ran."),
    "HYB-415": ErrorInfo("closed",
                         "The pipeline, stream or batcher was closed; it takes no more work."),
    "HYB-416": ErrorInfo("invalid memory operation",
                         "A memory-pool operation was given a bad handle (double free, foreign block) or "
                         "a bad size."),
    "HYB-417": ErrorInfo("no size for a dynamic input dim",
                         "An input has dynamic (symbolic) dims and nothing said what size to run it at: no "
                         "--shapes (or compile(shapes=...)), no --input file and no declared shape. hybrid "
                         "never makes a size up. The message names the dynamic dims and shows a --shapes line "
                         "to fill in."),
    "HYB-418": ErrorInfo("input value out of range",
                         "An integer input indexes a table of the model (token ids into an embedding, class ids "
                         "into a lookup) and holds a value outside it. Backends disagree on such values: some "
                         "raise, some return normal-looking numbers from whatever memory lies beyond the "
                         "table, so hybrid checks them before any backend runs. The message names the input, "
                         "the offending value and the valid range [-N, N) (negative values count from the "
                         "end, as ONNX Gather defines)."),
    # 5xx bundle
    "HYB-501": ErrorInfo("not a hybrid bundle",
                         "The file is not a readable .hybrid bundle (not a zip, or truncated)."),
    "HYB-502": ErrorInfo("invalid bundle manifest",
                         "manifest.json is missing, not JSON, or fails its schema."),
    "HYB-503": ErrorInfo("bundle member hash mismatch",
                         "A member's sha256 differs from the manifest: the bundle was modified or corrupted."),
    "HYB-504": ErrorInfo("unsafe bundle member",
                         "A member has an absolute path, '..', a link entry or a duplicate name."),
    "HYB-505": ErrorInfo("bundle limits exceeded",
                         "The bundle exceeds the size, member-count or compression-ratio caps (zip bomb "
                         "protection)."),
    "HYB-506": ErrorInfo("unsupported bundle format version",
                         "The bundle was written by a newer hybrid; upgrade pyasc."),
    "HYB-507": ErrorInfo("bundle member missing",
                         "A member the manifest lists is not in the bundle, or an unlisted member is."),
    "HYB-508": ErrorInfo("unknown platform profile",
                         "The platform name is not a built-in profile nor defined in the given TOML file. "
                         "`pyasc platforms` lists them."),
    "HYB-509": ErrorInfo("vendored libraries failed",
                         "Fetching or installing the wheels for --include-libs failed; the message carries "
                         "pip's error."),
    # 6xx quantization / calibration
    "HYB-601": ErrorInfo("invalid quantization config",
                         "A quantization key or value is invalid; the message lists the valid ones."),
    "HYB-602": ErrorInfo("empty calibration data",
                         "Static quantization needs at least one calibration sample."),
    "HYB-603": ErrorInfo("calibration sample does not match the model",
                         "A calibration sample has the wrong input names, shapes or dtypes; the message "
                         "names the sample index."),
    "HYB-604": ErrorInfo("calibration sample has NaN or Inf",
                         "Calibration ranges would be meaningless; the message names the sample index."),
    "HYB-605": ErrorInfo("accuracy budget not met",
                         "No int8 model meets the accuracy budget (only the float model does) and "
                         "accuracy={'on_unmet': 'raise'} was given; the message has the best int8 figures."),
    "HYB-606": ErrorInfo("quantization failed",
                         "The quantizer raised; the message carries its error."),
    # 7xx serving
    "HYB-701": ErrorInfo("model not found on the server", "No served model has that name or version."),
    "HYB-702": ErrorInfo("bad inference request",
                         "The request body is malformed: bad JSON, shapes, dtypes or byte sizes."),
    "HYB-703": ErrorInfo("unauthorized", "The request lacks the bearer token the server requires."),
    "HYB-704": ErrorInfo("request too large", "The body exceeds the server's limit after decompression."),
    "HYB-705": ErrorInfo("server overloaded", "The model's queue is full; retry later."),
    "HYB-706": ErrorInfo("server shutting down", "The server is draining and takes no new requests."),
    "HYB-707": ErrorInfo("invalid model repository",
                         "A served path breaks the repository layout: repo/<model>/<version>/model.hybrid (or "
                         "model.onnx), model names of letters, digits, '_', '-' and '.' not starting with '.', "
                         "versions positive integers, no link leading outside the repository, no model served "
                         "twice, a valid config.json, a config.pbtxt that parses and matches the model (input "
                         "and output names, data types, dims). The message names the offending path."),
    "HYB-708": ErrorInfo("internal server error",
                         "The server failed on a request in a way no check foresaw (HTTP 500). The response "
                         "names the exception type only; the server's log has the traceback."),
    "HYB-709": ErrorInfo("model control is off",
                         "The server was not started with --model-control (or it polls its repositories: "
                         "--model-control-mode poll), so the repository load and unload endpoints (HTTP and gRPC) "
                         "are refused (HTTP 503, gRPC UNAVAILABLE, as Triton answers); restart it with the flag to "
                         "use them."),
    "HYB-710": ErrorInfo("port in use",
                         "pyasc serve could not bind its HTTP or gRPC port (another process listens there, or the "
                         "address is not this machine's); it checks both before loading any model."),
    "HYB-711": ErrorInfo("shared memory region error",
                         "A system shared memory request the server cannot honour: a register request without a "
                         "key or with a bad offset or byte size, an object that cannot be opened or is smaller "
                         "than the region, more regions than the server holds at once, a tensor that runs past "
                         "the end of its region, or an output region too small for the output (HTTP 400, gRPC "
                         "INVALID_ARGUMENT)."),
    "HYB-712": ErrorInfo("shared memory region not registered",
                         "A request names a system shared memory region that is not registered with the server "
                         "(HTTP 404, gRPC NOT_FOUND)."),
    "HYB-713": ErrorInfo("shared memory region already registered",
                         "A system shared memory region of that name is registered already (HTTP 400, gRPC "
                         "ALREADY_EXISTS, as Triton answers)."),
    "HYB-714": ErrorInfo("request timeout expired",
                         "The request waited in its model's queue longer than the queue policy allows "
                         "(config.pbtxt's dynamic_batching.default_queue_policy: default_timeout_microseconds, "
                         "or the request's own timeout where allow_timeout_override is set) and was rejected "
                         "before it ran (HTTP 503, gRPC UNAVAILABLE, as Triton answers)."),
    "HYB-715": ErrorInfo("model not available",
                         "A readiness or statistics request names a model or version the server does not serve "
                         "(HTTP 400, gRPC INVALID_ARGUMENT, as Triton answers them; metadata, config and inference "
                         "answer HYB-701, 404)."),
    "HYB-716": ErrorInfo("server unreachable",
                         "A client of pyasc (pyasc bench --url) could not reach the server at the URL given: "
                         "nothing listens there, the host does not resolve, or the server did not answer its "
                         "liveness request (GET /v2/health/live, gRPC ServerLive) in time."),
}


# what to do about each code (`pyasc explain CODE` prints it after the cause); every code has one
FIXES: dict[str, str] = {
    "HYB-101": "Spell the key as the message lists it; `pyasc explain` and the config docs name every key.",
    "HYB-102": ("Give a value the message allows (on the command line: the flag's `--help` states the choices and "
              "ranges)."),
    "HYB-103": "Write the size as bytes or with a unit: 536870912, '512MB', '4GB', '1.5GiB'.",
    "HYB-104": "Use debug, info, warning, error or critical (pyasc --log-level info, or HYBRID_LOG_LEVEL=info).",
    "HYB-201": "Check the path (a relative path is from the current folder); give the .onnx or .hybrid file itself.",
    "HYB-202": ("Re-export or re-download the model; `python -c \"import onnx; onnx.load('m.onnx')\"` shows onnx's own "
              "error."),
    "HYB-203": ("Pass a path, bytes or an onnx.ModelProto; export a torch module with hybrid.export first; give the "
              "model file, not a folder of several."),
    "HYB-204": "Move the data file next to the model and set each tensor's 'location' to its plain file name.",
    "HYB-205": ("Fix the exporter's output (re-export; onnx.checker.check_model(m, full_check=True) names the rule), "
              "or restore the missing external data file beside the model."),
    "HYB-206": ("Read torch's error in the message; give example inputs of the real dtype and shape, or mark the "
              "failing submodule for tracing; export with another opset."),
    "HYB-207": "Install the extra the message names, e.g. pip install 'pyasc[torch]' or 'pyasc[report]'.",
    "HYB-208": "Compile at a lower optimize level (-O O1, or config optimize_level) or disable the named pass.",
    "HYB-209": ("Re-export the model with a dynamic batch axis (dynamic_axes / dynamic_shapes), or run it at its "
              "batch."),
    "HYB-210": ("Give example inputs matching the module's forward(), names that match them, and dynamic axes that "
              "exist; for an opset the exporter cannot honour, ask for the lowest opset the message names, or "
              "leave opset_version out."),
    "HYB-211": "Use one of hybrid.zoo.NAMES (the message lists them).",
    "HYB-301": "Use a target the message lists (`pyasc devices` shows this machine's), or 'auto'.",
    "HYB-302": ("Install the backend's package (pyasc devices says why it is unavailable), e.g. pip install "
              "'pyasc[openvino]'."),
    "HYB-303": "Pick a device that is present (`pyasc devices`), or 'auto' / 'cpu'.",
    "HYB-304": ("Try another target (-t openvino, -t onnxruntime) or 'auto'; for a precision error ask for one the "
              "backend offers on that device (the message lists them) or let --precision auto choose."),
    "HYB-305": ("Register the op with @hybrid.custom_op, install a backend that implements it, or re-export the model "
              "without it."),
    "HYB-306": "Use an option the message lists for that backend, with a value of the listed type.",
    "HYB-307": ("Run where the device is, or fall back: --device-fallback warn (hybrid.init({'device_fallback': "
              "'warn'}))."),
    "HYB-401": ("Give every input: on the command line -i NAME=FILE.npy, or --random to generate them (with --shapes "
              "for dynamic dims); in Python pass it by name."),
    "HYB-402": ("Name the inputs as the model does (the message lists them; `pyasc bundle inspect` or "
              "hybrid.Model.load(p).signature shows them)."),
    "HYB-403": "Cast the array to the model's dtype, e.g. x.astype(np.float32).",
    "HYB-404": "Reshape the array to the model's rank (np.expand_dims(x, 0) adds a batch axis).",
    "HYB-405": "Give the static dims the model fixes, and the same size to every input sharing a symbolic dim.",
    "HYB-406": "Pass numpy arrays (torch tensors: .cpu().numpy()); on the command line save inputs with numpy.save.",
    "HYB-407": "Pass at most one positional input per model input, or pass them by name.",
    "HYB-408": "Check the inputs' values and shapes; try another target; the message carries the backend's error.",
    "HYB-409": "Check the input shapes against the operator's definition; the message names the node and operator.",
    "HYB-410": "Raise the pool size (hybrid.init({'memory_pool': {...}})) or free tensors you hold.",
    "HYB-411": "Raise the timeout (request_timeout, --request-timeout) or the capacity (max_batch, concurrency).",
    "HYB-412": "Retry later, or raise max_queue (--max-queue) / add capacity.",
    "HYB-413": ("Return a list with exactly one result per request from the @dynamic_batch function; serve a "
                "model whose outputs do not keep the batch first with max_batch_size: 0 (--max-batch 0)."),
    "HYB-414": "Submit the request again if it is still wanted.",
    "HYB-415": "Create a new pipeline, stream or batcher; do not submit after close().",
    "HYB-416": "Free each block once, with the pool that allocated it, and ask for sizes > 0.",
    "HYB-417": ("Give the sizes you run: --shapes x:1x3x480x640 (the message's line, with the capitals replaced), a "
              "--min-shapes/--opt-shapes/--max-shapes range, or an input file (-i x=image.npy)."),
    "HYB-418": ("Keep the values inside the range the message gives: for token ids, use the tokenizer that belongs "
                "to the model (its vocabulary size is the embedding's row count)."),
    "HYB-501": ("Check that the file is a complete .hybrid (re-copy it); `pyasc bundle verify FILE` says what is "
              "wrong."),
    "HYB-502": "Re-create the bundle with pyasc bundle create; do not edit manifest.json by hand.",
    "HYB-503": "Re-create or re-download the bundle; it was modified after it was written.",
    "HYB-504": "Re-create the bundle with pyasc bundle create (it never writes such members).",
    "HYB-505": "Use a bundle from a trusted source; raise the limits only if you wrote it (hybrid.load(limits=...)).",
    "HYB-506": "Upgrade pyasc (pip install -U pyasc) to the version that wrote the bundle or later.",
    "HYB-507": "Re-create the bundle; a member was removed or added after it was written.",
    "HYB-508": "Use a name `pyasc platforms` lists, or define the profile in a TOML file (--platforms-file).",
    "HYB-509": ("Check network access to the index and the platform/Python asked for, or vendor local wheels (--wheel "
              "FILE)."),
    "HYB-601": "Use the keys and values the message lists (pyasc quantize --help states each flag's choices).",
    "HYB-602": ("Give samples: --calibration data.npz (arrays named by input) or a folder of .npz files; or use "
              "--method dynamic, which needs none."),
    "HYB-603": "Name each array after the input it feeds, with the model's dtype and rank, the same count per input.",
    "HYB-604": "Remove or clean the samples with NaN or Inf (np.isfinite(x).all()).",
    "HYB-605": ("Relax the budget (a lower --min-cosine), calibrate on more representative samples, or keep the float "
              "model."),
    "HYB-606": ("Read the quantizer's error in the message; try --method dynamic, --per-tensor, or another "
              "--calibration-method."),
    "HYB-701": "Use a model name and version the server lists (GET /v2/models or the start-up table).",
    "HYB-702": "Send the body the protocol defines: matching names, shapes, datatypes and byte sizes.",
    "HYB-703": "Send Authorization: Bearer <token> with the server's token.",
    "HYB-704": "Send a smaller request (split the batch) or raise the server's body limit.",
    "HYB-705": "Retry later with backoff, or raise the model's max_queue / add replicas.",
    "HYB-706": "Send to another replica, or retry once the server is back.",
    "HYB-707": "Fix the path the message names so the repository follows repo/<model>/<version>/model.hybrid.",
    "HYB-708": "Look in the server's log for the traceback and report it; retry the request.",
    "HYB-709": "Restart the server with --model-control to load and unload models at run time.",
    "HYB-710": "Stop what listens on the port (`ss -ltnp | grep PORT`), or choose another --port / --grpc-port.",
    "HYB-711": ("Create the shared memory object first, register a region that lies inside it, and give each tensor "
              "an offset and byte size inside its region (tritonclient.utils.shared_memory does both)."),
    "HYB-712": "Register the region first (register_system_shared_memory), or name one the status lists.",
    "HYB-713": "Unregister the region first, or register the new one under another name.",
    "HYB-714": ("Retry later, raise default_timeout_microseconds in the model's default_queue_policy, or add "
                "capacity (instance_group count, a smaller max_queue_delay_microseconds)."),
    "HYB-715": "Ask for a model and version the server lists (GET /v2/models/<name>, POST /v2/repository/index).",
    "HYB-716": ("Start the server first (pyasc serve MODEL, or tritonserver), and give its address with the protocol "
                "and port it listens on: --url http://HOST:8000 or --url grpc://HOST:8001."),
}


class HybridError(Exception):
    """Base class of every error hybrid raises for a failure a user can cause.

    Args:
        code: Stable code such as ``'HYB-401'``; see :data:`CATALOG`.
        message: One line: what was expected and what was found, naming the offending thing.
        hint: What to do about it.
    """

    area = "hybrid"

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        if code not in CATALOG:
            raise ValueError(f"unknown hybrid error code {code!r}")
        self.code = code
        self.message = message
        self.hint = hint
        text = f"[{code}] {message}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Callable[..., HybridError], tuple[type[HybridError], str, str, str | None]]:
        # keep codes across pickling by multiprocessing / concurrent.futures
        return (_rebuild, (type(self), self.code, self.message, self.hint))


def _rebuild(cls: type[HybridError], code: str, message: str, hint: str | None) -> HybridError:
    return cls(code, message, hint)


class ConfigError(HybridError):
    """1xx: configuration keys and values."""


class ModelError(HybridError):
    """2xx: loading, validating, exporting or transforming a model."""


class BackendError(HybridError):
    """3xx: devices, backends, compilation."""


class RunError(HybridError):
    """4xx: run inputs and runtime (queues, pool, timeouts)."""


class BundleError(HybridError):
    """5xx: the .hybrid bundle."""


class QuantizationError(HybridError):
    """6xx: quantization and calibration."""


class ServingError(HybridError):
    """7xx: the inference server."""


def explain(code: str) -> str:
    """Return the long explanation of an error code.

    Raises:
        KeyError: if the code is not in the catalog.
    """
    key = code.strip().upper()
    if not key.startswith("HYB-"):
        key = f"HYB-{key}"
    info = CATALOG[key]
    fix = FIXES.get(key)
    return f"{key}: {info.title}\n\ncause: {info.explanation}" + (f"\n\nfix: {fix}" if fix else "")


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first informative line of an exception's message, at most ``limit`` characters.

    Lines that only say where a C++ library threw (OpenVINO's ``Exception from src/...cpp:105:``) and
    blank lines are skipped; an empty message gives the exception's type name.
    """
    lines = [ln.strip() for ln in str(error).splitlines()]
    useful = [ln for ln in lines if ln and not (ln.startswith("Exception from ") and ln.endswith(":"))]
    text = useful[0] if useful else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
