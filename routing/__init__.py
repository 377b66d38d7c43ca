"""Pure routing domain: envelope, rules, sandbox, decision, signatures. No I/O beyond the sandbox child."""
