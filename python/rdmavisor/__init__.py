"""RDMAvisor vconns for Python: a pure-Python client of the pod protocol,
spoken to the node agent over the allocation's unix socket.

    import rdmavisor
    with rdmavisor.Client() as c:            # $RDMAVISOR_SOCKET
        with c.dial("10.0.0.7:7000") as v:
            v.sendall(b"ping")
            print(v.recv(4))
"""

from .errors import *  # noqa: F401,F403
from .errors import VConnError
from .vconn import ACCESS_READ, ACCESS_WRITE, Client, Listener, Message, Region, VConn, split_addr

__all__ = ["Client", "VConn", "Listener", "Region", "Message", "ACCESS_READ", "ACCESS_WRITE",
           "VConnError", "split_addr"]
__version__ = "0.1.0"
