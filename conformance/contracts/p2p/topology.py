"""The chaos topology: every node is reached only through its own toxiproxy proxy.

A :class:`ChaosCluster` is a :class:`conformance.contracts.p2p.harness.Cluster` whose nodes
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
(:mod:`conformance.contracts.p2p.faults` does this) cuts every connection between them, and a
fault on one node's proxy cuts everything addressed to that node.

Nodes keep their port and ``local_id`` across :meth:`Cluster.restart`, so a
restarted node sits behind the same proxy. Closing the cluster heals every
fault (:class:`conformance.contracts.p2p.faults.Faults`), closes the nodes and deletes the
cluster's proxies, so a fault never outlives the test that made it.
"""

from __future__ import annotations

from chaos.proxy import FaultProxyStopped, Proxy, Toxiproxy, ToxiproxyError
from conformance.contracts.p2p.faults import Faults
from conformance.contracts.p2p.harness import Cluster, Node
from conformance.contracts.p2p.spec import TransportSpec
from conformance.errors import CallBlocked
from conformance.testing.net import HOST

__all__ = ["ChaosCluster"]

class ChaosCluster(Cluster):
    """A cluster whose nodes are only reachable through per-node proxies.

    Args:
        spec: the transport under test.
        toxiproxy: the handle (the ``toxiproxy`` fixture of
            :mod:`chaos.fixtures`) on which the proxies are created.
        host: where nodes bind and proxies listen (loopback).
        call_limit: watchdog limit for building and closing nodes.

    ``faults`` is the cluster's :class:`conformance.contracts.p2p.faults.Faults`: every fault
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
        super().__init__(spec, host=host, call_limit=call_limit)
        self.toxiproxy = toxiproxy
        self._proxies: dict[int, Proxy] = {}
        #: Proxies created for a node that is still being built, by listen address.
        self._pending: dict[str, Proxy] = {}
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
        node = super().add_node(label, port=port, local_id=None, **options)
        self._proxies[id(node)] = self._pending.pop(node.local_id)
        return node

    def _advertise(self, label: str, port: int) -> str:
        """Create the proxy in front of ``port``; its listen address is the ``local_id``."""
        proxy = self.toxiproxy.create_proxy(
            self.toxiproxy.unique_name(f"node_{label}"),
            upstream=f"{self.host}:{port}",
            listen=f"{self.host}:0",
        )
        advertised = f"{proxy.listen_host}:{proxy.listen_port}"
        self._pending[advertised] = proxy
        return advertised

    def _withdraw(self, local_id: str) -> None:
        """Delete the proxy of a node that failed to bind."""
        self._pending.pop(local_id).destroy()

    def proxy(self, node: Node) -> Proxy:
        """The proxy in front of ``node`` (raises ``KeyError`` for a foreign node)."""
        try:
            return self._proxies[id(node)]
        except KeyError:
            raise KeyError(f"{node!r} is not a node of this chaos cluster") from None

    def close(self) -> None:
        """Heal every fault, close every node, delete the proxies.

        All three steps are attempted even if one fails; the first error is
        raised afterwards: a stopped fault proxy first (a run error: what else
        failed may be its consequence), then a blocked call (as in
        :meth:`Cluster.close`). When the server itself is down its proxies are
        not deleted one by one (each call would fail the same way); when only
        a proxy's calls hang (toxiproxy's RemoveToxic deadlock) while the
        server answers, the proxies are still deleted (that call works), so the
        wedged proxy does not stall the later tests' resets.
        """
        errors: list[BaseException] = []
        try:
            self.faults.heal_all()
        except (Exception, FaultProxyStopped) as exc:
            errors.append(exc)
        try:
            super().close()
        except Exception as exc:
            errors.append(exc)
        server_down = (any(isinstance(e, FaultProxyStopped) for e in errors)
                       and self.toxiproxy.problem() is not None)
        for proxy in list(self._proxies.values()):
            if server_down:
                break
            try:
                proxy.destroy()
            except (ToxiproxyError, FaultProxyStopped) as exc:
                errors.append(exc)
        self._proxies.clear()
        if errors:
            stopped = [e for e in errors if isinstance(e, FaultProxyStopped)]
            blocked = [e for e in errors if isinstance(e, CallBlocked)]
            raise (stopped or blocked or errors)[0]

    def __enter__(self) -> ChaosCluster:
        return self
