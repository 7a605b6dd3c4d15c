#!/usr/bin/python3
"""Stand-in for `tc qdisc ... netem loss L% delay D ms` where the kernel has no sch_netem.

mh_delay.py IF_A IF_B DELAY_MS LOSS_PERCENT STATS_FILE

Forwards every Ethernet frame received on IF_A to IF_B and back (AF_PACKET raw sockets,
run inside the harness's bridge namespace, IF_A = a host's veth end, IF_B = a veth into
the bridge), each one DELAY_MS later, in order, dropping LOSS_PERCENT of them at random
in each direction. STATS_FILE is rewritten every 0.2 s with "FORWARDED DROPPED".
Checksum and segmentation offloads must be off on the hosts' interfaces (the harness
does it): frames then carry complete checksums and fit the MTU.
"""
import collections
import os
import random
import socket
import sys
import threading
import time

ETH_P_ALL = 3
PACKET_OUTGOING = 4

if_a, if_b = sys.argv[1], sys.argv[2]
delay = float(sys.argv[3]) / 1000.0
loss = float(sys.argv[4]) / 100.0
stats_path = sys.argv[5]
counts = {"forwarded": 0, "dropped": 0}


def open_socket(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((ifname, 0))
    return s


def pump(src, dst):
    queue = collections.deque()
    ready = threading.Condition()

    def sender():
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, frame = queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # constant delay: the head is always the earliest
            with ready:
                queue.popleft()
            try:
                dst.send(frame)
                counts["forwarded"] += 1
            except OSError:
                counts["dropped"] += 1

    threading.Thread(target=sender, daemon=True).start()
    while True:
        frame, addr = src.recvfrom(65535)
        if addr[2] == PACKET_OUTGOING:  # our own sends on this interface
            continue
        if random.random() < loss:
            counts["dropped"] += 1
            continue
        with ready:
            queue.append((time.monotonic() + delay, frame))
            ready.notify()


def main():
    a, b = open_socket(if_a), open_socket(if_b)
    threading.Thread(target=pump, args=(a, b), daemon=True).start()
    threading.Thread(target=pump, args=(b, a), daemon=True).start()
    while True:
        with open(stats_path + ".new", "w") as f:
            f.write("%d %d\n" % (counts["forwarded"], counts["dropped"]))
        os.replace(stats_path + ".new", stats_path)
        time.sleep(0.2)


main()
