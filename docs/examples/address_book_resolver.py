"""A custom resolver whose address list the application changes at runtime.

Targets ``book:///NAME`` resolve to the addresses an :class:`AddressBook`
holds under NAME; ``book.set(NAME, [...])`` pushes the new list to every
channel using it, which then connects to new backends and drops removed ones
without a new channel. The LB policy comes from the channel's service config
(``grpc.service_config``) or ``grpc.lb_policy_name``, as for dns: targets.

    book = AddressBook()
    pyxds.resolver.registry.register("book", book.resolver_factory)
    book.set("greeter", ["127.0.0.1:50051"])
    with pyxds.insecure_channel("book:///greeter") as channel:
        ...
        book.set("greeter", ["127.0.0.1:50051", "127.0.0.1:50052"])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc

from pyxds.lb.api import Endpoint
from pyxds.resolver.api import DefaultConfigSelector, Resolver, ResolverArgs, ResolverResult
from pyxds.resolver.static_resolver import lb_selection_from_options
from pyxds.status import Status


class AddressBook:
    """Named address lists; resolvers subscribe to one name each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str, tuple[str, ...]] = {}
        self._subscribers: dict[str, list[Callable[[tuple[str, ...]], None]]] = {}

    def set(self, name: str, addresses: Sequence[str]) -> None:
        with self._lock:
            self._lists[name] = tuple(addresses)
            subscribers = list(self._subscribers.get(name, ()))
        for notify in subscribers:
            notify(tuple(addresses))

    def subscribe(self, name: str, notify: Callable[[tuple[str, ...]], None]) -> Callable[[], None]:
        with self._lock:
            self._subscribers.setdefault(name, []).append(notify)
            current = self._lists.get(name)
        if current is not None:
            notify(current)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.get(name, []).remove(notify)

        return unsubscribe

    def resolver_factory(self, args: ResolverArgs) -> Resolver:
        """What ``pyxds.resolver.registry.register`` takes: ResolverArgs -> Resolver."""
        return AddressBookResolver(args, self)


class AddressBookResolver(Resolver):
    """Publishes the book's list for the target's name, now and on every change."""

    def __init__(self, args: ResolverArgs, book: AddressBook) -> None:
        self._args = args
        self._book = book
        self._name = urlsplit(args.target).path.lstrip("/")
        self._unsubscribe: Callable[[], None] | None = None
        self._closed = False

    def start(self) -> None:
        self._unsubscribe = self._book.subscribe(self._name, self._publish)

    def _publish(self, addresses: tuple[str, ...]) -> None:
        # Any thread may change the book; results go to the channel on its serializer.
        selection = lb_selection_from_options(self._args.options)
        if isinstance(selection, Status):
            result = ResolverResult(endpoints=selection, service_config_error=selection)
        elif not addresses:
            status = Status(grpc.StatusCode.UNAVAILABLE, f"no addresses for {self._name!r}")
            result = ResolverResult(endpoints=status, lb_policy=selection)
        else:
            result = ResolverResult(
                endpoints=[Endpoint((address,)) for address in addresses],
                lb_policy=selection,
                config_selector=DefaultConfigSelector(),
            )
        self._args.serializer.run(lambda: None if self._closed else self._args.on_result(result))

    def request_reresolution(self) -> None:
        pass  # the book pushes changes itself; nothing to poll

    def shutdown(self) -> None:
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def config_dump(self) -> dict[str, Any]:
        return {"resolver": "address_book", "name": self._name}
