"""The running service: the composition root, delivery starts, upkeep schedules and the inbox relay.

May import switchboard (settings), routing, store, activities and workflows; never api, worker or cli.
"""
