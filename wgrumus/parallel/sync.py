"""Old module path of the gradient synchronisation names (now in ``wgrumus.distributed``)."""
from ..distributed.averaging import AllReduceSync, Event, EventLog, GradientAverager, flat_view
from ..distributed.zero import OptimizerSharding

__all__ = ["AllReduceSync", "Event", "EventLog", "GradientAverager", "flat_view",
           "OptimizerSharding"]
