"""gRPC clients that misbehave as gRPC's own clients never do, over raw HTTP/2.

- SlowSender starts one call and sends all but the last byte of a message
  of the size it is given, as fast as the server's flow-control window
  allows: the server holds what it received, waiting for the rest.
- NonReader sends whole calls but grants the server no flow-control window
  (its streams' initial window is 0, never raised): the server's answers
  can never be sent, and it holds them.
- StreamOpener opens streams and sends nothing more on them.
- HeaderFlooder opens a call whose header block never ends (CONTINUATION
  frames of new fields, one after another), or sends header blocks of a
  few bytes that unpack to megabytes (one large field indexed, then named
  again and again by its index).
- StreamResetter opens streams and resets each at once (HTTP/2's rapid
  reset), as fast as it can or at a pace: each costs the server a call,
  the client next to nothing. It takes the server's answers as fast as
  they come; SlowStreamResetter parses each, which is slower.

Just enough HTTP/2 for that (RFC 9113): the preface, SETTINGS and their
acknowledgements, literal headers, DATA within the windows, PING answers.
"""
import socket, struct, threading, time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
SETTINGS_INITIAL_WINDOW_SIZE = 4
END_STREAM, END_HEADERS = 0x1, 0x4

def frame(kind, flags, stream, payload=b""):
    """One HTTP/2 frame."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

def hpack_integer(value, prefix_bits, first_bits=0):
    """An HPACK integer (RFC 7541 5.1) after `first_bits` in its first byte."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([first_bits | value])
    out = [first_bits | top]
    value -= top
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + [value])

def literal(name, value, indexed=False):
    """A literal header field with a new name, no Huffman (RFC 7541 6.2):
    added to the decoder's table where `indexed`, else without indexing."""
    n, v = name.encode(), value.encode()
    return (b"\x40" if indexed else b"\x00") + hpack_integer(len(n), 7) + n + hpack_integer(len(v), 7) + v

def call_headers(path):
    return b"".join(literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers")])


class Http2Connection:
    """One connection: what the server sent, read on a thread of its own,
    and the windows it granted for what this side sends."""

    def __init__(self, port, settings=b""):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        self.window_conn = 65535
        self.window_stream = {}  # stream -> what the server lets it send
        self.initial_window = 65535
        self.closed = None  # Why the connection (or SlowSender's call) ended.
        # stream -> frames the server sent on it: ("headers", flags), ("data", n), ("reset",)
        self.frames = {}
        # Set once the server's SETTINGS have arrived and been acknowledged.
        self.settled = threading.Event()
        self._send(PREFACE + frame(4, 0, 0, settings))
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
                    self._on_frame(kind, flags, stream, payload)
                    self.cv.notify_all()
        except (EOFError, OSError):
            with self.cv:
                self.closed = self.closed or "eof"
                self.cv.notify_all()

    def _on_frame(self, kind, flags, stream, payload):
        if kind == 4 and not flags & 1:  # SETTINGS
            for i in range(0, len(payload), 6):
                ident, value = struct.unpack(">HI", payload[i:i + 6])
                if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                    for s in self.window_stream:
                        self.window_stream[s] += value - self.initial_window
                    self.initial_window = value
            self._send(frame(4, 1, 0))
            self.settled.set()
        elif kind == 8:  # WINDOW_UPDATE
            inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.window_conn += inc
            elif stream in self.window_stream:
                self.window_stream[stream] += inc
        elif kind == 6 and not flags & 1:  # PING
            self._send(frame(6, 1, 0, payload))
        elif kind == 7:
            self.closed = "GOAWAY"
        elif kind == 0:
            self.frames.setdefault(stream, []).append(("data", len(payload)))
        elif kind == 1:
            self.frames.setdefault(stream, []).append(("headers", flags))
        elif kind == 3:
            self.frames.setdefault(stream, []).append(("reset",))

    def start_call(self, stream, path=INFER_PATH):
        with self.cv:
            self.window_stream[stream] = self.initial_window
            self._send(frame(1, END_HEADERS, stream, call_headers(path)))

    def send_data(self, stream, data, end, until_seconds):
        """Sends `data` on `stream` as the windows allow, the last frame
        ending the stream if `end`, until the stream or connection ends or
        no window comes for `until_seconds`. Returns the bytes sent."""
        deadline = time.monotonic() + until_seconds
        sent = 0
        with self.cv:
            while sent < len(data) and not self.closed and not self.frames.get(stream):
                room = min(self.window_conn, self.window_stream[stream], 16384, len(data) - sent)
                if room <= 0:
                    if not self.cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                        break
                    continue
                last = end and sent + room == len(data)
                self._send(frame(0, END_STREAM if last else 0, stream, data[sent:sent + room]))
                sent += room
                self.window_conn -= room
                self.window_stream[stream] -= room
        return sent

    def close(self):
        # Shut down first: the reader thread's recv holds the socket open
        # past close() until something arrives.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class UnfinishedMessage:
    """A gRPC message but its last byte, made as it is sent: a 5-byte prefix
    (not compressed, its length), then zeros (it never arrives whole)."""

    def __init__(self, message_bytes):
        self.prefix = b"\0" + struct.pack(">I", message_bytes)
        self.length = 5 + message_bytes - 1

    def __len__(self):
        return self.length

    def __getitem__(self, part):
        start, stop, _ = part.indices(self.length)
        head = self.prefix[start:stop]
        return head + b"\0" * (stop - start - len(head))


class SlowSender(Http2Connection):
    def __init__(self, port, message_bytes, path=INFER_PATH):
        super().__init__(port)
        self.message = UnfinishedMessage(message_bytes)
        self.sent = 0
        self.start_call(1, path)

    def push(self, until_seconds):
        """Sends what the windows allow, up to all but the last byte, until
        the server closes the call or the connection, or it stops granting
        window for `until_seconds`. Returns the bytes sent."""
        self.sent = self.send_data(1, self.message, end=False, until_seconds=until_seconds)
        with self.cv:
            if self.frames.get(1):
                self.closed = self.closed or "the server ended the call"
        return self.sent


class NonReader(Http2Connection):
    def __init__(self, port):
        super().__init__(port, settings=struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0))
        self.next_stream = 1

    def call(self, message: bytes, until_seconds=30.0):
        """Sends one whole call (a serialized request message) and returns its
        stream once the server has sent its first HEADERS on it."""
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        self.start_call(stream)
        body = b"\0" + struct.pack(">I", len(message)) + message
        assert self.send_data(stream, body, end=True, until_seconds=until_seconds) == len(body)
        deadline = time.monotonic() + until_seconds
        with self.cv:
            while not self.frames.get(stream) and not self.closed:
                if not self.cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                    break
        return stream

    def state(self, stream):
        """'held': the answer began (headers) and waits for window; 'ended':
        answered with trailers only (a refusal); 'reset': the server dropped
        the call; None: nothing yet."""
        with self.cv:
            frames = self.frames.get(stream, [])
        if any(f[0] == "reset" for f in frames):
            return "reset"
        if any(f[0] == "headers" and f[1] & END_STREAM for f in frames):
            return "ended"
        return "held" if frames else None


class HeaderFlooder(Http2Connection):
    """Header blocks a server must not keep whole: ones that never end, and
    ones of a few bytes that unpack to megabytes."""

    def send_endless_block(self, limit_bytes):
        """Opens a call with HEADERS that do not end the block and sends
        CONTINUATION frames of new fields until the connection closes or
        `limit_bytes` are sent. Returns the bytes sent."""
        assert self.settled.wait(10), "the server sent no SETTINGS"
        self._send(frame(1, 0, 1, call_headers(INFER_PATH)))
        fields = b"".join(literal(f"x-field-{i}", "v" * 100) for i in range(120))
        sent = 0
        while sent < limit_bytes and not self.closed:
            self._send(frame(9, 0, 1, fields))
            sent += len(fields)
        return sent

    def send_unpacking_blocks(self, calls, field_bytes=4000, references=16000):
        """Opens up to `calls` calls, each header block adding a field of
        `field_bytes` to the decoder's table and naming it `references`
        times more (a byte each): field_bytes * references bytes unpacked
        from about `references` sent. Returns the calls sent before the
        connection closed."""
        assert self.settled.wait(10), "the server sent no SETTINGS"
        added = literal("x-large", "a" * field_bytes, indexed=True)
        named_again = hpack_integer(62, 7, 0x80) * references  # the newest entry of the table
        block = call_headers(INFER_PATH) + added + named_again
        sent = 0
        while sent < calls and not self.closed:
            self._send(frame(1, END_HEADERS, 1 + 2 * sent, block))
            sent += 1
            time.sleep(0.001)
        return sent


class StreamResetter(Http2Connection):
    def __init__(self, port):
        super().__init__(port)
        self.opened = 0

    def _read(self):
        # Acknowledges the server's SETTINGS unread and takes what the server
        # sends as fast as it comes, keeping none of it. (A client that
        # takes it slowly makes the calls pile up even so: SECURITY.md.)
        self._send(frame(4, 1, 0))
        self.settled.set()
        try:
            while self.sock.recv(1 << 20):
                pass
        except OSError:
            pass
        with self.cv:
            self.closed = self.closed or "eof"

    def reset_for(self, seconds, path, batch=100, per_second=None):
        """Opens streams calling `path` and resets each (CANCEL) right after
        its headers, `batch` at a time, at most `per_second` (None: as fast
        as it can), until `seconds` pass or the connection ends."""
        assert self.settled.wait(10), "the server sent no SETTINGS"
        headers = call_headers(path)
        cancel = struct.pack(">I", 8)
        stream = 1
        start = time.monotonic()
        while (time.monotonic() < start + seconds and not self.closed
               and stream < 2**31 - 2 * batch):
            frames = []
            for _ in range(batch):
                frames += [frame(1, END_HEADERS, stream, headers), frame(3, 0, stream, cancel)]
                stream += 2
            self._send(b"".join(frames))
            self.opened += batch
            if per_second:
                time.sleep(max(0.0, start + self.opened / per_second - time.monotonic()))


class SlowStreamResetter(StreamResetter):
    _read = Http2Connection._read


class StreamOpener(Http2Connection):
    """Opens streams and sends nothing more on them: each a call whose
    message never comes (or, for a streaming method, that never asks
    anything), which the server keeps until the connection closes."""

    def __init__(self, port):
        super().__init__(port)
        self.next_stream = 1

    def open(self, count, path=INFER_PATH, batch=500):
        """Opens `count` streams once the settings are exchanged, as a client
        that follows the protocol does (its limits then hold)."""
        assert self.settled.wait(10), "the server sent no SETTINGS"
        headers = call_headers(path)
        for start in range(0, count, batch):
            frames = []
            for _ in range(min(batch, count - start)):
                frames.append(frame(1, END_HEADERS, self.next_stream, headers))
                self.next_stream += 2
            self._send(b"".join(frames))

    def ended(self):
        """The streams the server reset or answered (refused), so far."""
        with self.cv:
            return sum(1 for frames in self.frames.values() if frames)
