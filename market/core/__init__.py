"""The economics: pure, I/O-free rules of the GPU market (world, ledger, actions, mechanisms,
negotiation, coalitions, collusion, shocks, execution, settlement, rewards, judging).

Imports nothing from the rest of the project but itself and ``scenarios``."""
