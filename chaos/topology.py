"""The chaos topology: every node is reached only through its own toxiproxy proxy.

A :class:`ChaosCluster` is a :class:`conformance.harness.Cluster` whose nodes
bind their ROUTER on a private port and *advertise* the address of a
toxiproxy proxy in front of it as their ``local_id``::

    node a  --connect(b.local_id)-->  proxy_b  -->  b's bound port
    node b  --connect(a.local_id)-->  proxy_a  -->  a's bound port

Peers only ever learn ``local_id`` (it is the routing identity and the
``peer_id``), so every byte from one node to another crosses the proxy of
the node it is addressed to. A transport of the DEALER-per-peer shape runs
two TCP connections per pair, one through each proxy; a transport that
talks both ways over one TCP connection runs it through the proxy of the
node that was connected to. Either way a fault put on *both* nodes' proxies
(:mod:`chaos.faults` does this) cuts every connection between them, and a
fault on one node's proxy cuts everything addressed to that node.

Nodes keep their port and ``local_id`` across :meth:`Cluster.restart`, so a
restarted node sits behind the same proxy. Closing the cluster heals every
fault (:class:`chaos.faults.Faults`), closes the nodes and deletes the
cluster's proxies, so a fault never outlives the test that made it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy import Proxy, Toxiproxy, ToxiproxyError
from conformance.errors import CallBlocked
from conformance.harness import HOST, Cluster, Node, free_port, is_address_in_use
from conformance.spec import TransportSpec

if TYPE_CHECKING:
    from chaos.faults import Faults

__all__ = ["ChaosCluster"]

#: Fresh ports tried for one node before giving up (another process or xdist
#: worker may take a port between choosing and binding it).
_BIND_ATTEMPTS = 8


class ChaosCluster(Cluster):
    """A cluster whose nodes are only reachable through per-node proxies.

    Args:
        spec: the transport under test.
        toxiproxy: the handle (the ``toxiproxy`` fixture of
            :mod:`chaos.fixtures`) on which the proxies are created.
        host: where nodes bind and proxies listen (loopback).
        call_limit: watchdog limit for building and closing nodes.

    ``faults`` is the cluster's :class:`chaos.faults.Faults`: every fault
    made through it is healed when the cluster closes.
    """

    def __init__(
        self,
        spec: TransportSpec,
        toxiproxy: Toxiproxy,
        *,
        host: str = HOST,
        call_limit: float | None = None,
    ) -> None:
        from chaos.faults import Faults  # faults needs this module's class

        super().__init__(spec, host=host, call_limit=call_limit)
        self.toxiproxy = toxiproxy
        self._proxies: dict[int, Proxy] = {}
        self.faults: Faults = Faults(self)

    def add_node(
        self,
        name: str | None = None,
        *,
        port: int | None = None,
        local_id: str | None = None,
        **options: int,
    ) -> Node:
        """Create a proxy, then a node bound on ``port`` that advertises the proxy.

        ``local_id`` cannot be chosen: it is always the proxy's listen
        address. Without ``port`` a free one is picked, and a new port (with a
        new proxy) is tried when binding fails with ``EADDRINUSE``.
        ``options`` are heartbeat overrides for :meth:`TransportSpec.build`.
        """
        if local_id is not None:
            raise ValueError(
                "ChaosCluster.add_node: local_id is always the node's proxy address; "
                "do not pass one"
            )
        label = name or f"chaos{len(self.nodes)}"
        attempts = 1 if port is not None else _BIND_ATTEMPTS
        last: BaseException | None = None
        for _ in range(attempts):
            bind_port = port if port is not None else free_port(self.host)
            proxy = self.toxiproxy.create_proxy(
                self.toxiproxy.unique_name(f"node_{label}"),
                upstream=f"{self.host}:{bind_port}",
                listen=f"{self.host}:0",
            )
            advertised = f"{proxy.listen_host}:{proxy.listen_port}"
            try:
                node = super().add_node(label, port=bind_port, local_id=advertised, **options)
            except AssertionError as exc:
                proxy.destroy()
                if not is_address_in_use(exc):
                    raise
                last = exc
                continue
            except BaseException:
                proxy.destroy()
                raise
            self._proxies[id(node)] = proxy
            return node
        raise AssertionError(
            f"could not bind chaos node {label!r} after {attempts} attempt(s): {last!r}"
        ) from last

    def proxy(self, node: Node) -> Proxy:
        """The proxy in front of ``node`` (raises ``KeyError`` for a foreign node)."""
        try:
            return self._proxies[id(node)]
        except KeyError:
            raise KeyError(f"{node!r} is not a node of this chaos cluster") from None

    def close(self) -> None:
        """Heal every fault, close every node, delete the proxies.

        All three steps are attempted even if one fails; the first error is
        raised afterwards (a blocked call first, as in :meth:`Cluster.close`).
        """
        errors: list[BaseException] = []
        try:
            self.faults.heal_all()
        except Exception as exc:
            errors.append(exc)
        try:
            super().close()
        except Exception as exc:
            errors.append(exc)
        for proxy in list(self._proxies.values()):
            try:
                proxy.destroy()
            except ToxiproxyError as exc:
                errors.append(exc)
        self._proxies.clear()
        if errors:
            blocked = [e for e in errors if isinstance(e, CallBlocked)]
            raise (blocked or errors)[0]

    def __enter__(self) -> ChaosCluster:
        return self
