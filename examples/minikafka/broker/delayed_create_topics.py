"""DelayedCreateTopics: a create-topics request waiting for partition leaders."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from purgatory_aio import DelayedOperation

from ..errors import ErrorCode
from ..protocol import CreateTopicsResponse


class DelayedCreateTopics(DelayedOperation[CreateTopicsResponse]):
    """Completes once every partition of the new topics has a leader.

    Watched under each topic being created; the controller checks a topic's key
    after each leader election. At the deadline the topics still missing a leader
    answer ``REQUEST_TIMED_OUT`` (their creation goes on regardless).

    Args:
        timeout: the request's timeout.
        errors: the validation outcome per topic; ``NONE`` ones are waited for.
        has_leaders: tells whether every partition of a topic has a leader.
    """

    __slots__ = ("_errors", "_has_leaders")

    def __init__(
        self,
        timeout: float,
        errors: Mapping[str, ErrorCode],
        has_leaders: Callable[[str], bool],
    ) -> None:
        super().__init__(timeout)
        self._errors = dict(errors)
        self._has_leaders = has_leaders

    def try_complete(self) -> bool:
        return self._all_led() and self.force_complete()

    def on_complete(self) -> CreateTopicsResponse:
        return CreateTopicsResponse(
            {
                topic: ErrorCode.REQUEST_TIMED_OUT
                if error is ErrorCode.NONE and not self._has_leaders(topic)
                else error
                for topic, error in self._errors.items()
            }
        )

    def _all_led(self) -> bool:
        has_leaders = self._has_leaders
        return all(
            has_leaders(topic) for topic, error in self._errors.items() if error is ErrorCode.NONE
        )
