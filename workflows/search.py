"""Custom search attributes that let operators filter deliveries in the Temporal UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

WEBHOOK_ID = SearchAttributeKey.for_keyword("SwitchboardWebhookId")
SOURCE = SearchAttributeKey.for_keyword("SwitchboardSource")
KIND = SearchAttributeKey.for_keyword("SwitchboardKind")
DECISION = SearchAttributeKey.for_keyword("SwitchboardDecision")
RULE_ID = SearchAttributeKey.for_keyword("SwitchboardRuleId")

ALL = (WEBHOOK_ID, SOURCE, KIND, DECISION, RULE_ID)
