"""How the workers of one attempt learn each other's TensorFlow gRPC addresses.

MultiWorkerMirroredStrategy needs every rank's ``host:port`` in TF_CONFIG
before any of them starts its gRPC server. Picking ports by "bind to 0, read
the number, close" races with every other process of the machine. Instead:

1. Each worker binds its own TCP socket to port 0 with ``SO_REUSEADDR`` and
   keeps it bound, never listening, for as long as the worker lives. The
   kernel gives that port to no other ``bind`` to port 0 and no outgoing
   connection meanwhile, so no process can take it; TensorFlow's gRPC server
   (which sets ``SO_REUSEADDR`` too) can still bind and listen on it because
   the held socket does not listen. The runtime's rendezvous port for
   ``torch.distributed`` is reserved the same way (docs/train.md).
2. Rank 0 listens on the attempt's rendezvous address and port (the driver
   reserved it for this attempt, as in 1.; ``get_context()``'s
   ``master_addr``/``master_port``); every other rank connects there (the
   address it connects from is its own gRPC host) and sends
   ``"<rank> <host> <port>"``.
3. Once all ranks are in, rank 0 sends every rank the full list, one line of
   JSON, and closes. A restarted group gets a new rendezvous port and new
   worker ports, so the old group's connections never get in its way.

Every wait is bounded (:data:`TIMEOUT_S`); a message that does not parse, a
rank out of range or twice is an error naming the peer. A rank that dies
meanwhile is seen by the driver, which stops the group.
"""

from __future__ import annotations

import json
import socket
import time

# How long a worker waits for the others to reach the rendezvous.
TIMEOUT_S = 120.0


def _held_socket(host: str) -> socket.socket:
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind((host, 0))
    return held


def _read_line(conn: socket.socket, peer: str, limit: int = 1 << 20) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"TensorFlow rendezvous: {peer} closed the connection early")
        data += chunk
        if len(data) > limit:
            raise ValueError(f"TensorFlow rendezvous: {peer} sent more than {limit} bytes")
    return data.decode("utf-8", "replace").strip()


def exchange_addresses(
    master_addr: str, master_port: int, rank: int, world_size: int
) -> tuple[socket.socket, list[str]]:
    """This rank's held socket (close it when the worker ends) and every
    rank's ``host:port``, indexed by rank.

    Raises:
        TimeoutError: the other ranks did not all arrive within TIMEOUT_S.
        ValueError: a peer sent a malformed message (named).
        ConnectionError: rank 0 went away mid-exchange.
    """
    deadline = time.monotonic() + TIMEOUT_S
    if world_size == 1:
        held = _held_socket(master_addr)
        return held, [f"{master_addr}:{held.getsockname()[1]}"]
    if rank == 0:
        return _gather(master_addr, master_port, world_size, deadline)
    return _send(master_addr, master_port, rank, deadline)


def _gather(
    master_addr: str, master_port: int, world_size: int, deadline: float
) -> tuple[socket.socket, list[str]]:
    held = _held_socket(master_addr)
    addresses: dict[int, str] = {0: f"{master_addr}:{held.getsockname()[1]}"}
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    conns: list[socket.socket] = []
    try:
        listener.bind((master_addr, master_port))
        listener.listen(world_size)
        while len(addresses) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(addresses))
                raise TimeoutError(
                    f"TensorFlow rendezvous: ranks {missing} did not arrive within "
                    f"{TIMEOUT_S:.0f} s at {master_addr}:{master_port}"
                )
            listener.settimeout(remaining)
            try:
                conn, peer_address = listener.accept()
            except socket.timeout:
                continue
            conns.append(conn)
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            peer = f"the peer at {peer_address[0]}:{peer_address[1]}"
            parts = _read_line(conn, peer).split()
            if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
                raise ValueError(f"TensorFlow rendezvous: {peer} sent a malformed message")
            peer_rank = int(parts[0])
            if not 0 < peer_rank < world_size or peer_rank in addresses:
                raise ValueError(
                    f"TensorFlow rendezvous: {peer} claims rank {peer_rank}, which is out of "
                    f"range [1, {world_size}) or already taken"
                )
            addresses[peer_rank] = f"{parts[1]}:{parts[2]}"
        ordered = [addresses[r] for r in range(world_size)]
        message = (json.dumps(ordered) + "\n").encode()
        for conn in conns:
            conn.sendall(message)
        return held, ordered
    except BaseException:
        held.close()
        raise
    finally:
        for conn in conns:
            conn.close()
        listener.close()


def _send(
    master_addr: str, master_port: int, rank: int, deadline: float
) -> tuple[socket.socket, list[str]]:
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection(
                (master_addr, master_port), timeout=max(deadline - time.monotonic(), 0.001)
            )
        except ConnectionRefusedError:
            # Rank 0 is not listening yet: poll, bounded by the deadline.
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"TensorFlow rendezvous: rank {rank} could not reach rank 0 at "
                    f"{master_addr}:{master_port} within {TIMEOUT_S:.0f} s"
                ) from None
            time.sleep(0.05)
    try:
        host = conn.getsockname()[0]
        held = _held_socket(host)
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            conn.sendall(f"{rank} {host} {held.getsockname()[1]}\n".encode())
            reply = json.loads(_read_line(conn, f"rank 0 at {master_addr}:{master_port}"))
        except BaseException:
            held.close()
            raise
    finally:
        conn.close()
    if not isinstance(reply, list) or not all(isinstance(a, str) for a in reply):
        held.close()
        raise ValueError("TensorFlow rendezvous: rank 0 sent a malformed address list")
    return held, reply
