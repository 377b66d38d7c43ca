"""Custom search attributes that let operators filter deliveries in the Temporal UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

WEBHOOK_ID = SearchAttributeKey.for_keyword("SwitchboardWebhookId")
SOURCE = SearchAttributeKey.for_keyword("SwitchboardSource")
KIND = SearchAttributeKey.for_keyword("SwitchboardKind")
DECISION = SearchAttributeKey.for_keyword("SwitchboardDecision")
RULE_ID = SearchAttributeKey.for_keyword("SwitchboardRuleId")
# The producer's own delivery id (X-GitHub-Delivery, a Stripe event id, ...), set at start when it sent one.
DELIVERY_ID = SearchAttributeKey.for_keyword("SwitchboardDeliveryId")
# The stored event (ev_...), upserted once the commit names it.
EVENT_ID = SearchAttributeKey.for_keyword("SwitchboardEventId")

# A re-route's RouteDelivery: the original event it routes again (reroute_webhook_event/s), set at start.
REROUTE_OF = SearchAttributeKey.for_keyword("SwitchboardRerouteOf")

ALL = (WEBHOOK_ID, SOURCE, KIND, DECISION, RULE_ID, DELIVERY_ID, EVENT_ID, REROUTE_OF)
