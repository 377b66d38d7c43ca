"""The authoring filter language the rule compiler's model fills in (language), its jq (to_jq), and the grounding
of the prompt in the webhook's sampled events (grounding)."""
