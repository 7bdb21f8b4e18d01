"""A timer signal interrupts a blocking select and its handler raises (test_selectors'
test_select_interrupt_exc in small): a backup must raise it at the same call."""
import selectors, signal, socket, time
class Interrupt(Exception):
    pass
def handler(*a):
    raise Interrupt
signal.signal(signal.SIGALRM, handler)
rd, wr = socket.socketpair()
s = selectors.DefaultSelector()
s.register(rd, selectors.EVENT_READ)
signal.alarm(1)
t = time.time()
try:
    s.select(30)
    print("not interrupted")
except Interrupt:
    print("interrupted after", round(time.time() - t, 1))
