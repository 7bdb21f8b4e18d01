"""A replica node, sans-IO: one membership core and one messaging endpoint composed
(`node.ReplicaNode`), the group's log of inputs and order info that joining backups replay."""
