"""Messages between the local executor and its worker processes: a 4-byte length, then a pickle.

Pickle is safe here because both ends are kopt in processes this user started (the candidate never
runs in a worker process: it runs in the verifier's sandbox child, which the worker starts).
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

_LENGTH = struct.Struct("<I")


def send(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _exactly(stream: IO[bytes], count: int) -> bytes | None:
    chunks, left = [], count
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(stream: IO[bytes]) -> Any | None:
    """The next value, or None at the end of the stream (the other side exited or closed it)."""
    head = _exactly(stream, _LENGTH.size)
    if head is None:
        return None
    data = _exactly(stream, _LENGTH.unpack(head)[0])
    return None if data is None else pickle.loads(data)
