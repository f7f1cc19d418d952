"""Remote backends: lanes answered by another OpenAI-compatible server (`[remote.<lane>]`).

`gate.FairGate` admits requests to one remote lane: a bounded queue (the lane's `max_queue`,
then 429), at most `concurrency` in flight, the next slot to the member with the fewest
virtual tokens (the scheduler's `FairShare`). `client.RemoteClient` talks HTTP to the remote
and turns what goes wrong into `RemoteFailure`s (502/504). `relay.RemoteLane` puts the two
together for one lane: admission, the body sent, the stream relayed to its `[DONE]`, failures
and fallbacks counted. None of them knows FastAPI; the API's `homeai.api.dispatch` puts them
in front of the routes.
"""

from homeai.remote.client import RemoteClient, RemoteFailure
from homeai.remote.gate import FairGate, GateClosed, QueueFull, Ticket

__all__ = ["FairGate", "GateClosed", "QueueFull", "Ticket", "RemoteClient", "RemoteFailure"]
