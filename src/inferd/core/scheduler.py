"""The dynamic batcher and the instances it feeds.

Requests are queued by the event loop thread; each instance runs on its own thread and, whenever
it is free, takes the next batch from the queue itself. The batch is formed by the instance, under
the scheduler's lock, which gives three things at once:

- no round trip through the event loop between two batches of one instance: a busy loop never
  leaves an instance idle;
- ``max_queue_delay_microseconds`` honoured with the precision of a futex wait (event-loop timers
  round to milliseconds), so a 150 us delay means 150 us;
- the natural batching that keeps a server fast under load: whatever queued while every instance
  was busy leaves as one batch.

The only work on the event loop per request is an append under a lock (and a wake-up when an
instance sleeps). The instance hands its results to ``deliver`` on its own thread: front ends
encode and send answers there, in parallel with the loop (the socket write releases the GIL), and
only the bookkeeping goes back to the loop, once per batch.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING

import numpy as np

from inferd.core.errors import InferdError, InternalError, InvalidRequest, Unavailable
from inferd.core.types import InferRequest, Tensors

if TYPE_CHECKING:
    from inferd.backends.base import Backend, Device

log = logging.getLogger("inferd.scheduler")

#: Called on the instance thread: (batch, per-request outputs or None, error or None,
#: queue/input/infer/output ns).
Delivery = Callable[[list[InferRequest], "list[Tensors] | None", "InferdError | None", int, int, int, int], None]


class BatchPolicy:
    """The batching and queueing rules of one model, read from its configuration."""

    __slots__ = (
        "max_batch_size",
        "dynamic",
        "preferred",
        "max_queue_delay_ns",
        "max_queue_size",
        "timeout_ns",
        "timeout_delays",
        "allow_timeout_override",
    )

    def __init__(
        self,
        max_batch_size: int = 0,
        dynamic: bool = False,
        preferred: tuple[int, ...] = (),
        max_queue_delay_ns: int = 0,
        max_queue_size: int = 0,
        timeout_ns: int = 0,
        timeout_delays: bool = False,
        allow_timeout_override: bool = False,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.dynamic = dynamic and max_batch_size > 0
        self.preferred = frozenset(preferred)
        self.max_queue_delay_ns = max_queue_delay_ns
        self.max_queue_size = max_queue_size
        self.timeout_ns = timeout_ns
        self.timeout_delays = timeout_delays
        self.allow_timeout_override = allow_timeout_override


class Instance:
    """One backend on one device, served by one thread."""

    def __init__(self, name: str, backend: Backend, device: Device) -> None:
        self.name = name
        self.backend = backend
        self.device = device
        # A plain lock used as a binary semaphore: cheaper than a Condition, and its timed
        # acquire is as precise as the kernel's futex.
        self.wake = threading.Lock()
        self.wake.acquire()
        #: set (under the scheduler's lock) when new work woke this instance
        self.woken = False
        self.thread: threading.Thread | None = None


class Scheduler:
    """One queue per model version, drained by that version's instances."""

    def __init__(
        self,
        model_name: str,
        policy: BatchPolicy,
        instances: list[Instance],
        loop: asyncio.AbstractEventLoop,
        deliver: Delivery,
    ) -> None:
        self.model_name = model_name
        self.policy = policy
        self.instances = instances
        self.loop = loop
        self.deliver = deliver
        self.lock = threading.Lock()
        self.queue: deque[InferRequest] = deque()
        self.delayed: deque[InferRequest] = deque()
        self.idle: list[Instance] = []
        #: requests in batches that instances are running now
        self.executing = 0
        #: requests in the batch dispatched last: more than one means clients are concurrent
        self.last_batch = 0
        #: instances woken for new work that have not taken it yet
        self.waking = 0
        #: requests whose queue timeout passed, to be failed outside the lock
        self.expired: list[InferRequest] = []
        #: computed batches whose answers the responder thread sends
        self.replies: queue.SimpleQueue[tuple[list[InferRequest], list[Tensors], tuple[int, int, int, int]] | None] = (
            queue.SimpleQueue()
        )
        self._responder: threading.Thread | None = None
        self.running = True
        self._has_deadlines = policy.timeout_ns > 0 or policy.allow_timeout_override

    # -- event loop side -------------------------------------------------------------------
    def enqueue(self, request: InferRequest) -> None:
        """Queue a validated request; raises Unavailable when the queue is full or closed."""
        policy = self.policy
        now = perf_counter_ns()
        request.enqueued_ns = now
        if self._has_deadlines:
            timeout = policy.timeout_ns
            if policy.allow_timeout_override and request.parameters and "timeout" in request.parameters:
                value = request.parameters["timeout"]
                if type(value) is not int or value < 0:
                    raise InvalidRequest(
                        f"parameter 'timeout' must be a non-negative integer (microseconds), not {value!r}"
                    )
                timeout = value * 1000
            if timeout > 0:
                request.deadline_ns = now + timeout
        with self.lock:
            if not self.running:
                raise Unavailable(f"model '{self.model_name}' is shutting down")
            # Requests that a just-woken instance is about to take are not waiting in the queue.
            if policy.max_queue_size and len(self.queue) - self.waking >= policy.max_queue_size:
                raise Unavailable(
                    f"exceeds maximum queue size: model '{self.model_name}' already has "
                    f"{policy.max_queue_size} requests queued (max_queue_size)"
                )
            self.queue.append(request)
            if self.idle:
                instance = self.idle.pop()
                instance.woken = True
                self.waking += 1
                instance.wake.release()

    def start(self) -> None:
        self._responder = threading.Thread(target=self._respond, name=f"inferd-{self.model_name}-reply", daemon=True)
        self._responder.start()
        for instance in self.instances:
            instance.thread = threading.Thread(
                target=self._work, args=(instance,), name=f"inferd-{instance.name}", daemon=True
            )
            instance.thread.start()

    def stop(self) -> list[InferRequest]:
        """Stop taking batches; wakes every instance so its thread ends. Returns what was queued."""
        with self.lock:
            self.running = False
            left = list(self.queue) + list(self.delayed)
            self.queue.clear()
            self.delayed.clear()
            while self.idle:
                self.idle.pop().wake.release()
        for instance in self.instances:
            if instance.thread is not None:
                instance.thread.join(timeout=60)
        if self._responder is not None:
            self.replies.put(None)
            self._responder.join(timeout=60)
        return left

    def queue_size(self) -> int:
        return len(self.queue) + len(self.delayed)

    # -- instance threads ------------------------------------------------------------------
    def _next_batch(self, instance: Instance) -> tuple[list[InferRequest] | None, int]:
        """Under the lock: the next batch, or None and how long to wait (0 = until woken)."""
        queue = self.queue
        policy = self.policy
        now = perf_counter_ns()
        if self._has_deadlines and (queue or self.delayed):
            self._expire(now)
            if not queue and not self.delayed:
                return None, 0
        if not queue:
            if self.delayed:
                # Requests whose timeout passed under timeout_action DELAY run when nothing else waits.
                return [self.delayed.popleft()], 0
            return None, 0
        if not policy.dynamic:
            return [queue.popleft()], 0
        head = queue[0]
        signature = head.signature
        limit = policy.max_batch_size
        preferred = policy.preferred
        rows = count = preferred_count = 0
        for request in queue:
            if request.signature != signature or rows + request.rows > limit:
                break
            rows += request.rows
            count += 1
            if rows in preferred:
                preferred_count = count
            if rows == limit:
                break
        full = rows == limit or count < len(queue)
        # The queue delay exists to let concurrent requests gather. When nothing else of this
        # model is running and the last batch was a lone request, there is no sign of anyone to
        # wait for, and waiting would only add the delay to every request of a single client
        # (Triton waits regardless).
        if not full and policy.max_queue_delay_ns and (self.executing or self.last_batch > 1):
            if preferred_count:
                count = preferred_count
            else:
                wait = head.enqueued_ns + policy.max_queue_delay_ns - now
                if wait > 0:
                    return None, wait
        elif preferred_count and not full and preferred:
            count = preferred_count
        if count == len(queue):
            batch = list(queue)
            queue.clear()
        else:
            batch = [queue.popleft() for _ in range(count)]
        self.last_batch = count
        return batch, 0

    def _expire(self, now: int) -> None:
        expired = self.expired
        keep: deque[InferRequest] = deque()
        for request in self.queue:
            if request.deadline_ns and request.deadline_ns <= now:
                if self.policy.timeout_delays:
                    request.deadline_ns = 0
                    self.delayed.append(request)
                else:
                    expired.append(request)
            else:
                keep.append(request)
        if len(keep) != len(self.queue):
            self.queue.clear()
            self.queue.extend(keep)

    def _work(self, instance: Instance) -> None:
        backend = instance.backend
        lock = self.lock
        deliver = self.deliver
        name = self.model_name
        finished = 0
        while True:
            with lock:
                self.executing -= finished
                finished = 0
                if instance.woken:
                    instance.woken = False
                    self.waking -= 1
                if not self.running:
                    return
                batch, wait_ns = self._next_batch(instance)
                if batch is None:
                    self.idle.append(instance)
                else:
                    self.executing += len(batch)
                    finished = len(batch)
                expired = self.expired
                if expired:
                    self.expired = []
            if expired:
                error = Unavailable(f"request timeout expired while queued for model '{name}'")
                deliver(expired, None, error, 0, 0, 0, 0)
            if batch is None:
                if wait_ns:
                    woken = instance.wake.acquire(timeout=wait_ns / 1e9)
                    if not woken:
                        with lock:
                            if instance in self.idle:
                                self.idle.remove(instance)
                                continue
                        # Someone popped us and released (or is releasing) the wake lock: consume it.
                        instance.wake.acquire()
                else:
                    instance.wake.acquire()
                continue
            start = perf_counter_ns()
            queue_ns = sum(start - r.enqueued_ns for r in batch)
            try:
                if len(batch) == 1:
                    feeds = batch[0].inputs
                else:
                    first = batch[0].inputs
                    feeds = {key: np.concatenate([r.inputs[key] for r in batch]) for key in first}
                computed = perf_counter_ns()
                outputs = backend.run(feeds)
                ran = perf_counter_ns()
                results = self._split(batch, outputs)
                done = perf_counter_ns()
            except InferdError as exc:
                deliver(batch, None, exc, queue_ns, 0, 0, 0)
                continue
            except Exception as exc:  # a backend failure must never kill the instance thread
                log.warning("model '%s' instance %s failed a batch: %s", name, instance.name, exc)
                deliver(batch, None, InternalError(f"model '{name}' failed to run: {exc}"), queue_ns, 0, 0, 0)
                continue
            timings = (queue_ns, computed - start, ran - computed, done - ran)
            if self.queue:
                # More work is waiting: leave the answers to the responder thread and go straight
                # back to the model, so computing the next batch overlaps with sending this one.
                # With nothing queued, answering here is quicker than a hand-off.
                self.replies.put((batch, results, timings))
            else:
                deliver(batch, results, None, *timings)

    def _respond(self) -> None:
        deliver = self.deliver
        while True:
            item = self.replies.get()
            if item is None:
                return
            batch, results, timings = item
            deliver(batch, results, None, *timings)

    def _split(self, batch: list[InferRequest], outputs: Tensors) -> list[Tensors]:
        if len(batch) == 1:
            return [outputs]
        total = sum(r.rows for r in batch)
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != total:
                raise InternalError(
                    f"model '{self.model_name}' returned output '{name}' with shape {list(value.shape)} "
                    f"for a batch of {total}"
                )
        results = []
        offset = 0
        for request in batch:
            end = offset + request.rows
            results.append({name: value[offset:end] for name, value in outputs.items()})
            offset = end
        return results
