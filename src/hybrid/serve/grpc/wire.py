"""``ModelInferRequest`` read with its tensor bytes left where they arrived.

grpcio hands a method's deserializer the received message as one ``bytes`` object. Parsed whole by protobuf, its
``raw_input_contents`` are copied twice more before they become arrays: into the parsed message, then into a new
``bytes`` object at each access. For an image that is two copies of every request's data on the event loop's thread.

:func:`read_infer_request` walks the message's top-level fields instead (a few per request: the model's name, the
tensors' descriptions, the raw contents). The raw contents stay views of the received bytes; protobuf parses only the
other fields. The result is the message protobuf would have parsed, less its ``raw_input_contents``, which come
beside it in order. Whatever the walk does not expect (a field that runs past the end, a malformed varint, a group)
goes to protobuf whole, which parses or refuses it exactly as before.

The views may start at any byte: an array over one may be unaligned for its datatype. A served model gives its
backend aligned inputs (its batch join copies them; a request run alone is copied where unaligned).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import service_pb2 as pb

__all__ = ["ReceivedInfer", "read_infer_request"]

_RAW_TAG = (7 << 3) | 2
"""The tag of ``raw_input_contents`` (field 7, length-delimited): 0x3A, one byte."""


class _Unexpected(Exception):
    """The walk met something it does not read: protobuf parses the whole message."""


@dataclass(slots=True)
class ReceivedInfer:
    """A received ``ModelInferRequest``.

    Attributes:
        message: Every field of the request but ``raw_input_contents``.
        raw: The request's ``raw_input_contents`` in order, each a read-only view of the received bytes (or of
            protobuf's copy, where the whole message was parsed).
    """

    message: pb.ModelInferRequest
    raw: list[memoryview] = field(default_factory=list)

    @classmethod
    def parsed(cls, message: pb.ModelInferRequest) -> ReceivedInfer:
        """A request protobuf parsed whole, raw contents kept (each read once: protobuf copies per access)."""
        return cls(message, [memoryview(b) for b in message.raw_input_contents])


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        if shift > 63:
            raise _Unexpected
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7


def _spans(body: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The byte ranges of the other fields (merged where they follow each other) and of each raw content."""
    others: list[tuple[int, int]] = []
    raw: list[tuple[int, int]] = []
    size, pos, kept_from = len(body), 0, 0
    try:
        while pos < size:
            field_at = pos
            tag, pos = _varint(body, pos)
            wire = tag & 7
            if wire == 2:
                length, pos = _varint(body, pos)
                end = pos + length
            elif wire == 0:
                end = _varint(body, pos)[1]
            elif wire == 1:
                end = pos + 8
            elif wire == 5:
                end = pos + 4
            else:
                raise _Unexpected
            if end > size:
                raise _Unexpected
            if tag == _RAW_TAG:
                if kept_from < field_at:
                    others.append((kept_from, field_at))
                raw.append((pos, end))
                kept_from = end
            pos = end
    except IndexError:  # a varint cut off by the end
        raise _Unexpected from None
    if kept_from < size:
        others.append((kept_from, size))
    return others, raw


def read_infer_request(body: bytes) -> ReceivedInfer:
    """The request in ``body`` (a serialized ``ModelInferRequest``), its raw contents as views of ``body``.

    Raises:
        google.protobuf.message.DecodeError: Where protobuf would refuse ``body``.
    """
    try:
        others, raw = _spans(body)
    except _Unexpected:
        received = ReceivedInfer.parsed(pb.ModelInferRequest.FromString(body))
        del received.message.raw_input_contents[:]  # the views keep the contents: the message need not
        return received
    if not raw:
        return ReceivedInfer(pb.ModelInferRequest.FromString(body))
    view = memoryview(body)
    if len(others) == 1:
        rest: bytes | memoryview = view[others[0][0]:others[0][1]]
    else:  # none, or raw contents between other fields (protobuf writes them last)
        rest = b"".join(view[a:b] for a, b in others)
    return ReceivedInfer(pb.ModelInferRequest.FromString(rest), [view[a:b] for a, b in raw])
