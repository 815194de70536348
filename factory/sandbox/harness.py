"""The program a checked execution runs inside the sandbox: the untrusted code in a child process,
the trusted test in this one, and the end-of-check marker printed only when the checks ran to their end.

Not imported by the host: checked.py sends this file's text with one call appended,
`_harness(code, test, entry_point, context, marker)`, the arguments written as literals; the host
puts the execution's nonce (32 hex digits) on stdin. Stdlib only.

Two processes, so that the untrusted code never shares one with the nonce or the test:
- this process (the checker) makes itself non-dumpable (no same-uid process may read its memory or
  open its /proc files), reads the nonce from stdin, erases stdin (ftruncate empties the memfd for
  every holder) and replaces it by /dev/null, runs the trusted `context` and `test` (which defines
  `check`), then forks;
- the child zeroes its copy of the nonce, runs `code` as `__main__`, and then either reports "done"
  (no entry point: the program itself is the check) or serves calls to `entry_point`;
- `check(candidate)` runs here, and `candidate` forwards each call to the child with marshal, which
  carries only exact builtin values (int, float, complex, str, bytes, bool, None, and lists, tuples,
  dicts, sets and frozensets of them; a subclass or an object with its own `__eq__` cannot cross);
- only when `check` returns normally, with no broken call recorded, does the checker kill the child
  and write "\\n<marker> <nonce>\\n" to stdout and exit 0. Every other end writes one line
  "factory-check: <reason>" to stderr and exits 1; a child killed by a signal is mirrored (the
  checker dies of the same signal) so the sandbox still classifies CPU limits and crashes.
"""

import os
import sys

_TAG = "factory-check:"
_NONCE_BYTES = 32  # the host's secrets.token_hex(16)
_MAX_MESSAGE = 256 << 20  # a reply larger than this is refused, not buffered
_SCALARS = frozenset(map(id, (int, float, complex, str, bytes, bool, type(None))))
_CONTAINERS = frozenset(map(id, (list, tuple, set, frozenset)))


def _harness(code, test, entry_point, context, marker):
    _undumpable()
    nonce = _read_nonce()
    check = None
    if entry_point is not None:  # the trusted part: it runs in this process only
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        _run_trusted(context, "<context>", namespace)
        _run_trusted(test, "<test>", namespace)
        check = namespace.get("check")
        if not callable(check):
            _finish(None, "the test defines no check(candidate) function", 1)
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    _finish(None, "", 0)  # flush: output the test printed must not be written twice, by both processes
    pid = os.fork()
    if pid == 0:
        try:
            nonce[:] = bytes(len(nonce))  # in place: the child's memory keeps no copy of the nonce
            os.close(requests_w)
            os.close(replies_r)
            _child(code, entry_point, requests_r, replies_w)
        finally:  # whatever the program breaks, the child never goes on into the checker's code below
            os._exit(1)
    os.close(requests_r)
    os.close(replies_w)
    child = _Child(pid, requests_w, replies_r)
    first = child.receive()  # ("done",) | ("ready",) | ("fail", reason), once the program's code has run
    if first is None:
        child.died()
    if first[0] == "fail" and len(first) == 2 and type(first[1]) is str:
        child.fail(first[1])
    if first != (("done",) if entry_point is None else ("ready",)):
        child.fail(child.problem or "the program broke the harness protocol")
    if entry_point is None:
        child.succeed(nonce, marker)
    namespace[entry_point] = candidate = child.proxy(entry_point)  # a test may name the function itself
    try:
        check(candidate)
    except BaseException as exc:  # whatever ended check() early, it did not pass
        if child.dead:
            child.died()
        child.fail(child.problem or f"check() raised {_describe(exc, '<test>')}", exc, {"<test>": test})
    if child.dead:
        child.died()
    if child.problem:  # check() swallowed the exception of a broken call
        child.fail(child.problem)
    child.succeed(nonce, marker)


class _Child:
    """The child that runs the untrusted code, seen from the checker."""

    def __init__(self, pid, requests, replies):
        self.pid, self.requests, self.replies = pid, requests, replies
        self.dead = False
        self.problem = ""

    def receive(self):
        """The child's next message, or None when it is gone (or spoke something that is not one)."""
        import marshal

        header = _read_exact(self.replies, 8)
        if header is not None:
            size = int.from_bytes(header, "big")
            if size > _MAX_MESSAGE:
                self.problem = f"the program sent a reply of {size} bytes"
                return ("bad",)
            payload = _read_exact(self.replies, size)
            if payload is not None:
                try:
                    message = marshal.loads(payload)
                except (ValueError, EOFError, TypeError):
                    message = None
                if type(message) is tuple and message and type(message[0]) is str:
                    return message
                self.problem = "the program broke the harness protocol"
                return ("bad",)
        self.dead = True
        return None

    def proxy(self, entry_point):
        import marshal

        def candidate(*args, **kwargs):
            if self.dead:
                raise _ProgramGone(f"the program is gone; {entry_point}() cannot be called")
            try:
                request = marshal.dumps((args, kwargs))
            except ValueError:
                raise TypeError(f"{entry_point}() was called with a value that cannot be sent to the program "
                                "(only plain builtin values can)") from None
            try:
                _write_all(self.requests, len(request).to_bytes(8, "big") + request)
            except OSError:  # EPIPE: the child is gone
                self.dead = True
                raise _ProgramGone(f"the program ended during a call to {entry_point}()") from None
            reply = self.receive()
            if reply is None:
                raise _ProgramGone(f"the program ended during a call to {entry_point}()")
            if len(reply) == 2 and reply[0] == "ok" and _plain(reply[1]):
                return reply[1]
            if len(reply) == 3 and reply[0] == "raise" and type(reply[1]) is str and type(reply[2]) is str:
                raise _exception(reply[1], reply[2])
            if len(reply) == 2 and reply[0] == "fail" and type(reply[1]) is str:
                self.problem = self.problem or reply[1]
                raise _ProgramGone(reply[1])
            if reply[0] in ("ok", "bad"):
                name = reply[1] if len(reply) == 2 and type(reply[1]) is str else "another kind"
                self.problem = self.problem or (
                    f"{entry_point}() returned a value of type {name[:80]}: only exact builtin values "
                    "(int, float, complex, str, bytes, bool, None and lists, tuples, dicts, sets of them) are compared")
            else:
                self.problem = self.problem or "the program broke the harness protocol"
            raise _NotPlain(self.problem)

        return candidate

    def died(self):
        """The child ended without a word: say how, and end the same way (never returns)."""
        status = self._reap()
        if status is not None and os.WIFSIGNALED(status):
            import signal

            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            _say(f"the program was killed by {name} before its checks finished")
            try:  # die of the same signal, so a CPU limit still reads as a timeout and SIGSEGV as a crash
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be caught: already the default
                pass
            os.kill(os.getpid(), sig)
            os._exit(1)
        code = os.WEXITSTATUS(status) if status is not None else "unknown"
        _finish(None, self.problem or f"the program exited (status {code}) before its checks finished", 1)

    def fail(self, reason, exc=None, sources=None):
        self._kill()
        _finish(exc, reason, 1, sources)

    def succeed(self, nonce, marker):
        self._kill()
        _finish(None, "", 0)  # flushes what the test printed before the marker
        line = b"\n" + marker.encode() + b" " + bytes(nonce) + b"\n"
        _write_all(1, line)
        os._exit(0)

    def _kill(self):
        import signal

        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap()

    def _reap(self):
        """The child's wait status (waiting for it also adds its CPU time to ours), or None."""
        try:
            return os.waitpid(self.pid, 0)[1]
        except ChildProcessError:
            return None


class _ProgramGone(BaseException):
    """The child ended or broke the protocol during a call.

    A BaseException, so a test's `except Exception` cannot hide it (and `self.problem` is kept anyway)."""


class _NotPlain(BaseException):
    """A call returned something that is not a plain builtin value."""


def _child(code, entry_point, requests, replies):
    """In the child: run the untrusted code, then serve calls. Never returns."""
    import marshal

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<program>", "exec", dont_inherit=True, optimize=0), namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the program did not run to its end
        _send(replies, ("fail", f"the program {_ended_early(exc, '<program>')}"))
        _print_traceback(exc, {"<program>": code})
        os._exit(1)
    if entry_point is None:
        _send(replies, ("done",))
        os._exit(0)
    function = namespace.get(entry_point)
    if not callable(function):
        _send(replies, ("fail", f"the program defines no function {entry_point}()"))
        os._exit(1)
    _send(replies, ("ready",))
    while True:
        header = _read_exact(requests, 8)
        request = _read_exact(requests, int.from_bytes(header, "big")) if header is not None else None
        if request is None:
            os._exit(0)
        args, kwargs = marshal.loads(request)
        try:
            reply = ("ok", function(*args, **kwargs))
        except Exception as exc:
            reply = ("raise", type(exc).__name__, _text(exc))
        except BaseException as exc:  # sys.exit() inside the function: it did not return
            _send(replies, ("fail", f"{entry_point}() {_ended_early(exc, '<program>')}"))
            os._exit(1)
        try:
            _send(replies, reply)
        except ValueError:  # marshal refuses anything but exact builtin types
            _send(replies, ("bad", type(reply[1]).__name__))


def _undumpable():
    """PR_SET_DUMPABLE 0: the child (same uid) may not ptrace us, read /proc/<pid>/mem or open our fds.

    Fail closed: a checker whose memory the program could read is no checker."""
    try:
        import ctypes

        failed = ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0  # 4 = PR_SET_DUMPABLE
        problem = f"prctl errno {ctypes.get_errno()}" if failed else ""
    except (ImportError, OSError, AttributeError) as exc:
        problem = repr(exc)
    if problem:
        _finish(None, f"cannot protect the checker from the program: {problem}", 1)


def _read_nonce():
    nonce = bytearray(_NONCE_BYTES)  # read straight into it: no other copy exists in our memory
    got = os.readv(0, [nonce])
    try:
        os.ftruncate(0, 0)  # a memfd: empty it for every process that holds it
    except OSError:  # a pipe (run outside the sandbox): reading consumed it
        pass
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if got != _NONCE_BYTES:
        _finish(None, "no nonce on stdin (run checked programs through Sandbox.map_checked)", 1)
    return nonce


def _run_trusted(source, name, namespace):
    try:
        exec(compile(source, name, "exec", dont_inherit=True, optimize=0), namespace)
    except BaseException as exc:  # the test itself is broken: not the candidate's failure, but no pass either
        _finish(exc, f"the trusted {name[1:-1]} code raised {_describe(exc, name)}", 1, {name: source})


def _plain(value):
    """True when `value` is built only of exact builtin types (marshal can also make code objects, ...)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        kind = id(type(item))
        if kind in _SCALARS:
            continue
        if kind in _CONTAINERS or kind == id(dict):
            if id(item) not in seen:
                seen.add(id(item))
                stack.extend(item.items() if kind == id(dict) else item)
            continue
        return False
    return True


def _exception(name, message):
    """The exception the program raised, rebuilt here: the builtin class of that name, else RuntimeError."""
    import builtins

    cls = getattr(builtins, name, None)
    text = f"(raised in the program) {message}"
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except TypeError:  # e.g. UnicodeDecodeError wants five arguments
            pass
    return RuntimeError(f"{name}: {text}")


def _ended_early(exc, filename):
    if isinstance(exc, SystemExit):
        code = "" if exc.code is None else _text(exc.code)
        return f"exited early (SystemExit({code})) before its checks finished"
    return f"raised {_describe(exc, filename)}"


def _describe(exc, filename):
    """'AssertionError: message (<test> line 12)': the exception and the deepest line of `filename`."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            where = f" ({filename} line {tb.tb_lineno})"
        tb = tb.tb_next
    message = _text(exc)
    return f"{type(exc).__name__}{': ' + message if message else ''}{where}"


def _text(value):
    try:
        return str(value)[:300]
    except Exception:  # a hostile __str__: the type name is enough
        return "<unprintable>"


def _print_traceback(exc, sources):
    try:
        import linecache
        import traceback

        for name, source in sources.items():  # so the traceback shows the lines of our exec'd code
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        traceback.print_exception(exc)
    except Exception:  # best effort: the reason line is what the host reads
        pass


def _finish(exc, reason, status, sources=None):
    """Flush, say `reason` on stderr (when failing) and, for a failure, exit with `status`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if status == 0:
        return
    _say(reason)
    if exc is not None:
        _print_traceback(exc, sources or {})
    os._exit(status)


def _say(reason):
    try:
        _write_all(2, f"\n{_TAG} {reason}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def _send(fd, message):
    import marshal

    data = marshal.dumps(message)
    _write_all(fd, len(data).to_bytes(8, "big") + data)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, size):
    """Exactly `size` bytes from `fd`, or None at end of file first."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
