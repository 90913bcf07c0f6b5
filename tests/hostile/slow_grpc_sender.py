"""A gRPC client that never finishes its message, over raw HTTP/2.

gRPC's own clients send a message whole; an attacker need not. SlowSender
opens one connection, starts one call, and sends all but the last byte of a
message of the size it is given, as fast as the server's flow-control
window allows: the server holds what it received, waiting for the rest.
Just enough HTTP/2 for that (RFC 9113): the preface, SETTINGS and their
acknowledgements, literal headers, DATA within the windows, PING answers.
"""
import socket, struct, threading, time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

def frame(kind, flags, stream, payload=b""):
    """One HTTP/2 frame."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

def literal(name, value):
    # Literal header field without indexing, new name, no Huffman.
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


class SlowSender:
    def __init__(self, port, message_bytes, path="/inference.GRPCInferenceService/ModelInfer"):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.lock = threading.Lock()
        self.window_conn = 65535
        self.window_stream = 65535
        self.initial_window = 65535
        self.closed = None
        self.cv = threading.Condition(self.lock)
        self.sent = 0
        # The gRPC message: a 5-byte prefix (not compressed, its length), then
        # the message's bytes (zeros: it never arrives whole).
        self.total = 5 + message_bytes
        self.prefix = b"\0" + struct.pack(">I", message_bytes)
        self._send(PREFACE + frame(4, 0, 0))
        headers = b"".join(literal(k, v) for k, v in [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers")])
        self._send(frame(1, 0x4, 1, headers))
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, data):
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = self.closed or "reset"

    def _recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _read(self):
        try:
            while True:
                head = self._recv_exact(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = self._recv_exact(length)
                with self.cv:
                    if kind == 4 and not flags & 1:  # SETTINGS
                        for i in range(0, len(payload), 6):
                            ident, value = struct.unpack(">HI", payload[i:i + 6])
                            if ident == 4:
                                self.window_stream += value - self.initial_window
                                self.initial_window = value
                        self._send(frame(4, 1, 0))
                    elif kind == 8:  # WINDOW_UPDATE
                        inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                        if stream == 0:
                            self.window_conn += inc
                        else:
                            self.window_stream += inc
                    elif kind == 6 and not flags & 1:  # PING
                        self._send(frame(6, 1, 0, payload))
                    elif kind == 3:
                        self.closed = "RST_STREAM"
                    elif kind == 7:
                        self.closed = "GOAWAY"
                    elif kind == 1:  # HEADERS: an answer came
                        self.closed = "answered"
                    self.cv.notify_all()
        except (EOFError, OSError):
            with self.cv:
                self.closed = self.closed or "eof"
                self.cv.notify_all()

    def push(self, until_seconds):
        """Sends what the windows allow, up to all but the last byte, until
        the server closes the call or the connection, or it stops granting
        window for `until_seconds`. Returns the bytes sent."""
        deadline = time.monotonic() + until_seconds
        with self.cv:
            while self.sent < self.total - 1 and not self.closed:
                room = min(self.window_conn, self.window_stream, 16384, self.total - 1 - self.sent)
                if room <= 0:
                    if not self.cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                        break
                    continue
                if self.sent < 5:
                    chunk = self.prefix[self.sent:5][:room]
                else:
                    chunk = b"\0" * room
                self._send(frame(0, 0, 1, chunk))
                self.sent += len(chunk)
                self.window_conn -= len(chunk)
                self.window_stream -= len(chunk)
        return self.sent

    def close(self):
        self.sock.close()
