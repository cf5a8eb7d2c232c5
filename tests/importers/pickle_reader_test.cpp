// Pickles written by Python itself (pickle.dump, protocols 0 to 5) read back
// exactly; refused, truncated and corrupted pickles give errors, never a
// crash.
#include "importers/pickle_reader.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "importers/snapshot_import.h"
#include "python_generated.h"

using namespace memscope;

namespace {

// Writes the test pickles, and next to each the canonical text of what
// Python holds (see Canon below, which prints a PyValue the same way).
constexpr const char* kGenerator = R"PY(
import collections, os, pickle, pickletools, random, struct, sys

out = sys.argv[1]

def canon(v):
    if v is None: return 'N'
    if v is True: return 'T'
    if v is False: return 'F'
    if isinstance(v, int): return 'i%d;' % v
    if isinstance(v, float): return 'f%d;' % struct.unpack('<Q', struct.pack('<d', v))[0]
    if isinstance(v, str):
        b = v.encode('utf-8')
        return 's%d:%s' % (len(b), b.hex())
    if isinstance(v, (bytes, bytearray)): return 'b%d:%s' % (len(v), v.hex())
    if isinstance(v, list): return '[' + ','.join(canon(x) for x in v) + ']'
    if isinstance(v, tuple): return '(' + ','.join(canon(x) for x in v) + ')'
    if isinstance(v, dict):
        return '{' + ','.join(canon(k) + ':' + canon(x) for k, x in v.items()) + '}'
    raise TypeError(type(v))

def write(name, text):
    with open(os.path.join(out, name), 'w') as f:
        f.write(text)

def dump(name, value, protocol):
    with open(os.path.join(out, name), 'wb') as f:
        pickle.dump(value, f, protocol=protocol)

rng = random.Random(1234)
actions = ['alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free', 'oom']
files = ['/usr/lib/python3/dist-packages/torch/nn/modules/module.py', 'train.py',
         'model.py', 'donn\u00e9es.py']
# Shared frame dicts, as PyTorch's symbolizer makes: pickled once, then BINGET.
pool = [{'filename': rng.choice(files), 'line': rng.randrange(1, 5000), 'name': 'fn%d' % k}
        for k in range(40)]

def frames():
    return [rng.choice(pool) for _ in range(rng.randrange(0, 6))]

def trace(k):
    return {'action': rng.choice(actions), 'addr': 0x7f0000000000 + k * 512,
            'size': rng.randrange(0, 2**40), 'stream': 0,
            'time_us': 1700000000000000 + k, 'frames': frames()}

segments = []
for s in range(30):
    base = 0x7f0000000000 + s * 2**21
    blocks = [{'address': base + b * 4096, 'size': 4096, 'requested_size': 4000 + b,
               'state': rng.choice(['active_allocated', 'inactive', 'active_pending_free']),
               'frames': frames()} for b in range(rng.randrange(1, 5))]
    segments.append({'device': s % 2, 'address': base, 'total_size': 2**21,
                     'allocated_size': 4096 * len(blocks), 'active_size': 4096,
                     'requested_size': 4000, 'stream': 0, 'segment_type': 'large',
                     'segment_pool_id': (0, 0), 'is_expandable': False,
                     'frames': frames(), 'blocks': blocks})

traces = [[trace(k) for k in range(2600)], [], [trace(k) for k in range(5)]]
ints = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1,
        2**63, 2**64 - 1, -1, -2, -128, -129, -255, -256, -2**31, -2**31 - 1, -2**63 + 1,
        -2**63]
snap = {
    'segments': segments,
    'device_traces': traces,
    'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': None, 'max_split_size': -1,
                           'garbage_collection_threshold': 0.0, 'expandable_segments': False,
                           'release_lock_on_cudamalloc': True,
                           'roundup_power2_divisions': {'1': 0, '2': 4}},
    'external_annotations': [{'device': 0, 'stage': 'START', 'name': 'fwd', 'time_us': 17},
                             {'device': 0, 'stage': 'END', 'name': 'fwd', 'time_us': 99}],
    'misc': {'ints': ints,
             'floats': [0.0, -0.0, 1.5, -2.25, 0.1, 1e308, 5e-324, float('inf'), float('-inf')],
             'none': None, 'bools': [True, False], 'tuple': (1, 'a', None, 2.5, 'alloc'),
             'tuple2': (1, 2), 'tuple0': (), 'nested': [[1, [2, [3, []]]], [[[]]], [[]]],
             'unicode': 'h\u00e9llo \u2713 \U0001d11e',
             'bigstr': 'x' * 70000, 'intkeys': {1: 'one', 2: 'two', -5: 'minus'},
             'bigdict': {'k%d' % k: k for k in range(1500)},
             'shared_flat': [pool[0], pool[0], (1, 2), (1, 2)]},
}
write('snap.canon', canon(snap))
for p in range(6):
    dump('snap_p%d.pickle' % p, snap, p)
write('traces0.canon', '\n'.join(canon(t) for t in traces[0]) + '\n')
write('traces2.canon', '\n'.join(canon(t) for t in traces[2]) + '\n')
write('frames0.txt', ' '.join(str(k) for k, t in enumerate(traces[0]) if t['frames']))
streamed = dict(snap, device_traces=[[], [], traces[2]])
write('streamed0.canon', canon(streamed))

single = dict(snap, device_traces=[traces[0]])
for p in (2, 4):
    dump('single_p%d.pickle' % p, single, p)

# PyTorch 1.13: a bare list of segments, blocks with history.
legacy = [{'device': 0, 'address': 0x7f0000000000 + s * 2**21, 'total_size': 2**21,
           'allocated_size': 512, 'active_size': 512, 'stream': 0, 'segment_type': 'large',
           'blocks': [{'size': 512, 'state': 'active_allocated',
                       'history': [{'addr': 0x7f0000000000 + s * 2**21, 'real_size': 500,
                                    'frames': frames()}]},
                      {'size': 2**21 - 512, 'state': 'inactive', 'history': []}]}
          for s in range(3)]
write('legacy.canon', canon(legacy))
for p in (2, 4):
    dump('legacy_p%d.pickle' % p, legacy, p)

small = {'segments': [{'a': 1, 'frames': [pool[1], pool[1]]}],
         'device_traces': [[{'action': 'alloc', 'size': 2**64 - 1}, {'action': 'alloc'}]],
         'x': (1.5, -3, None, True, '\u00e9', 70000, 2**40)}
for p in (2, 4):
    dump('small_p%d.pickle' % p, small, p)

for p in (2, 4):
    dump('ordered_p%d.pickle' % p, collections.OrderedDict(a=1), p)
# Protocols 0-2 pickle bytes with _codecs.encode (REDUCE): refused.
dump('bytes_p2.pickle', b'ab', 2)
blobs = [b'\x00\xffabc', b'', b'x' * 300, bytearray(b'xy')]
write('bytes.canon', canon(blobs))
dump('bytes_p5.pickle', blobs, 5)
dump('bytes_p3.pickle', blobs[:3], 3)
write('bytes3.canon', canon(blobs[:3]))
nested = [[1], [2]]
dump('shared_nested.pickle', [nested, nested], 4)
write('shared_nested.canon', canon([nested, nested]))
rec = []
rec.append(rec)
dump('recursive.pickle', rec, 4)
# PyTorch's shape: one frames list object per traceback, handed to the block,
# its alloc entry and its segment; frame dicts shared between tracebacks.
tf = [{'filename': 'model%d.py' % (k % 7), 'line': k, 'name': 'fn%d' % k} for k in range(60)]
stacks = [[tf[(s * 7 + j) % 60] for j in range(20)] for s in range(50)]
tt, tb = [], []
for k in range(20000):
    st = stacks[k % 50]
    addr = 0x7f0000000000 + k * 512
    tt.append({'action': 'alloc', 'addr': addr, 'size': 512, 'stream': 0, 'time_us': k, 'frames': st,
               'compile_context': 'N/A', 'user_metadata': '', 'pool_id': (0, 0)})
    if k % 2:
        tt.append({'action': 'free_requested', 'addr': addr, 'size': 512, 'stream': 0, 'time_us': k, 'frames': st})
        tt.append({'action': 'free_completed', 'addr': addr, 'size': 512, 'stream': 0, 'time_us': k, 'frames': st})
    elif k < 100:
        tb.append({'address': addr, 'size': 512, 'requested_size': 512, 'state': 'active_allocated', 'frames': st})
torch_snap = {'segments': [{'device': 0, 'address': 0x7f0000000000, 'total_size': 2**21, 'frames': stacks[0],
                            'blocks': tb}],
              'device_traces': [tt], 'allocator_settings': {}, 'external_annotations': []}
dump('torch_p4.pickle', torch_snap, 4)
write('torch_segments.canon', canon(torch_snap['segments']))
write('torch_entry.canon', '\n'.join(canon(tt[k]) for k in (0, 1, 2, len(tt) - 1)) + '\n')
deep = []
for _ in range(50):
    deep = [deep]
dump('deep.pickle', deep, 4)

# The trace-entry fast path (PickleReadOptions::fast_dicts): entries of
# every shape it takes, and between them, entries it leaves to the general
# path (a dict with an int or float key, a frames list of 1200 frames, a
# nested dict of 40 pairs, a list entry), an entry dict written
# twice in one batch (a memo reference to a dict the fast path read) and in
# two batches (the second refers to a released entry: an error).
ff = [{'filename': 'f%d.py' % k, 'line': k * 7, 'name': '\u00e9fn%d' % k} for k in range(30)]
fstacks = [[ff[(s * 3 + j) % 30] for j in range(2 + s % 9)] for s in range(20)]
fe = []
for k in range(3000):
    e = {'action': ['alloc', 'free_requested', 'free_completed'][k % 3], 'addr': 0x7f0000000000 + k * 512,
         'size': [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40, 2**64 - 1][k % 9], 'stream': -k,
         'time_us': 1700000000000000 + k, 'frames': fstacks[k % 20] if k % 5 else list(fstacks[k % 20]),
         'compile_context': 'N/A', 'user_metadata': '', 'pool_id': (0, k % 2)}
    if k % 7 == 0: e['t'] = 1.5 * k
    if k % 11 == 0: e['flags'] = [None, True, False, (), (1,), (1, 2, 3), (1, 2, 3, 4), [], {}, {'a': 1}]
    if k % 13 == 0: e['big'] = -2**63
    if k % 17 == 0: e['neg'] = -(2**40) - k
    fe.append(e)
fe[1500]['intkey'] = {1: 'x'}
fe[1501]['frames'] = [ff[k % 30] for k in range(1200)]
fe[1502]['nested'] = {'k%d' % k: k for k in range(40)}
fe[1503] = ['a list entry', 1]
fe[1504]['floatkey'] = {2.5: 1}
fe[1505]['fresh'] = 'new string %d' % 1505
fe.insert(1600, fe[1599])
fe.insert(1750, fe[1700])  # 1700 is read fast: this is a memo reference to it
fe_err = fe + [fe[1100]]  # read fast, released with its batch
fast = {'segments': [], 'device_traces': [fe], 'allocator_settings': {}, 'external_annotations': []}
fast_err = dict(fast, device_traces=[fe_err])
rec = list(fe)
rec[2500] = dict(rec[2500])
rec[2500]['self'] = rec[2500]  # a dict that holds itself: refused
fast_rec = dict(fast, device_traces=[rec])
for p in range(6):
    dump('fast_p%d.pickle' % p, fast, p)
for p in (2, 4, 5):
    dump('fast_err_p%d.pickle' % p, fast_err, p)
    dump('fast_rec_p%d.pickle' % p, fast_rec, p)

# Records (PickleReadOptions::on_record) as the snapshot importer takes
# them: entries of PyTorch's keys, and among them one with an unknown key
# (1100) and one without a container (1106: no frames, no pool_id), which
# the reader leaves to the dict paths; a segment_alloc (1102) and a
# user_defined annotation (1104: name and stage, keys the importer takes).
ri = []
for k in range(1200):
    ri.append({'action': 'alloc', 'addr': 0x7e0000000000 + k * 1024, 'size': 1000 + k, 'stream': 0,
               'time_us': 5000 + k, 'frames': stacks[k % 50], 'compile_context': 'N/A', 'user_metadata': '',
               'pool_id': (0, 0)})
ri[1100]['mystery'] = 7
ri[1102] = {'action': 'segment_alloc', 'addr': 0x7d0000000000, 'size': 2**21, 'stream': 0, 'time_us': 6102,
            'frames': stacks[3]}
ri[1104] = {'action': 'user_defined', 'name': 'forward:3', 'stage': 'START', 'time_us': 6104, 'frames': []}
del ri[1106]['frames']
del ri[1106]['pool_id']
rimp = {'segments': [], 'device_traces': [ri], 'allocator_settings': {}, 'external_annotations': []}
for p in (2, 4):
    dump('rec_imp_p%d.pickle' % p, rimp, p)

# Frames lists read again by their bytes (the reader's cache), written by
# hand (protocol 4, no FRAME): entries 1 to 8 have the same frames bytes (memo
# references 100 and 101); entry 4 replaces 100 (a str) before its frames,
# entry 7 replaces 101: each must read what the memo holds then.
def ustr(t):
    b = t.encode()
    return b'\x8c' + len(b).to_bytes(1, 'little') + b
def put(i): return b'r' + i.to_bytes(4, 'little')
def get(i): return b'j' + i.to_bytes(4, 'little')
def frame(i, name): return b'}' + put(i) + b'(' + ustr('filename') + ustr(name) + ustr('line') + b'K\x07u'
def entry(i, frames, extra=b''):
    return (b'}' + put(1000 + i) + b'(' + ustr('action') + ustr('alloc') + ustr('addr') + b'J' +
            (4096 * (i + 1)).to_bytes(4, 'little') + ustr('size') + b'M\x00\x02' + extra + ustr('frames') + b']' +
            put(2000 + i) + b'(' + frames + b'e' + b'u')
refs = get(100) + get(101)
lc = b'\x80\x04}' + put(0) + b'(' + ustr('device_traces') + b']' + put(1) + b'(' + b']' + put(2)
lc += b'(' + entry(0, frame(100, 'a.py') + frame(101, 'b.py')) + entry(1, refs) + b'e'  # the first batch
lc += b'(' + entry(2, refs) + entry(3, refs) + entry(4, refs, ustr('user_metadata') + ustr('x') + put(100))
lc += entry(5, refs) + entry(6, refs) + entry(7, refs, ustr('user_metadata') + ustr('y') + put(101)) + entry(8, refs)
lc += b'e' + b'e' + b'u.'
with open(os.path.join(out, 'list_cache_p4.pickle'), 'wb') as f:
    f.write(lc)

# The record template (PickleReadOptions::fast_template), written by hand
# (protocol 4, MEMOIZE as Python's pickler writes it) so that each entry's
# shape is known. Device 0's entries, after a first batch (E0, read
# generally: the list is not known to be streamed yet):
#   E1       keys action, addr, size, frames (order A): read by FastPairs, the template made
#   E2-E4    order A, frames [f0, f1] (E1's bytes: the lists cache), [f0] (APPEND), []: template
#   E5       order A with a FRAME between addr and its value: FastPairs, the template made again
#   E6, E7   order A (a FRAME before E6's EMPTY_DICT, between entries): template
#   E8       order B (action, size, addr, frames): FastPairs
#   E9-E11   order B (E11 in the next batch): template
#   E12      no frames (not a record); its size 'x' is put over the memo id of the str 'addr'
#   E13      order B's bytes, its addr key now 'x' (the memo changed): a dict, not a record
#   E14      order B, 'addr' written anew (a key not by reference): FastPairs, no template
#   E15      order B: FastPairs, the template made; E16, E17: template
#   E18      order C (action, addr, size, frames, compile_context, pool_id; a new str and a
#            new tuple each entry, MEMOIZEd): FastPairs, its new keys written out: no template
#   E19      order C: FastPairs, the template made; E20: template
#   E21      order C, the dict memoized by BINPUT (its next id, as MEMOIZE would): FastPairs
#   E22      template
#   E23      order B: the other template (made at E15)
#   E24      order C: the other template again
#   E25      order C, its frames list put (LONG_BINPUT) over E24's frames list's id: FastPairs
#   E26      template
# 24 records (E12 and E13 are not), 15 of them by a template.
def template_pickle():

    class Asm:
        def __init__(self):
            self.b = bytearray(b'\x80\x04')
            self.memo = {}
            self.n = 0
        def w(self, x):
            self.b += x
        def memoize(self, key=None):
            self.w(b'\x94')
            if key is not None:
                self.memo[key] = self.n
            self.n += 1
        def ref(self, key):
            i = self.memo[key]
            self.w(b'h' + bytes([i]) if i < 256 else b'j' + i.to_bytes(4, 'little'))
        def s(self, text, fresh=False):
            if not fresh and ('s', text) in self.memo:
                self.ref(('s', text))
                return text
            e = text.encode()
            self.w(b'\x8c' + bytes([len(e)]) + e)
            self.memoize(('s', text))
            return text
        def int_(self, x):
            if 0 <= x < 256:
                self.w(b'K' + bytes([x]))
            elif -2**31 <= x < 2**31:
                self.w(b'J' + x.to_bytes(4, 'little', signed=True))
            else:
                e = pickle.encode_long(x)
                self.w(b'\x8a' + bytes([len(e)]) + e)
            return x

    a = Asm()
    fd = []  # the frame dicts (Python objects), memo keys ('f', k)
    def frame_dict(k):
        d = {'filename': 'f%d.py' % k, 'line': k + 1}
        a.w(b'}')
        a.memoize(('f', k))
        a.w(b'(')
        a.s('filename'); a.s(d['filename']); a.s('line'); a.int_(d['line'])
        a.w(b'u')
        fd.append(d)
    def frames(ks, define=False, put_over=None):
        a.w(b']')
        if put_over is None:
            a.memoize(('l', len(a.b)))
        else:
            a.w(b'r' + a.memo[put_over].to_bytes(4, 'little'))
        a.last_list = ('l', len(a.b))
        a.memo[a.last_list] = a.n - 1 if put_over is None else a.memo[put_over]
        if len(ks) == 1:
            a.ref(('f', ks[0]))
            a.w(b'a')
        elif ks:
            a.w(b'(')
            for k in ks:
                if define:
                    frame_dict(k)
                else:
                    a.ref(('f', k))
            a.w(b'e')
        return [fd[k] for k in ks]
    frame_at = None
    def frame_start():  # a FRAME from here to the end of the entry
        nonlocal frame_at
        frame_at = len(a.b)
    def frame_end():
        nonlocal frame_at
        if frame_at is not None:
            a.b[frame_at:frame_at] = b'\x95' + (len(a.b) - frame_at).to_bytes(8, 'little')
            frame_at = None

    ORDER_A = ['action', 'addr', 'size', 'frames']
    ORDER_B = ['action', 'size', 'addr', 'frames']
    ORDER_C = ['action', 'addr', 'size', 'frames', 'compile_context', 'pool_id']
    entries = []
    def entry(k, order, fr=(0, 1), define=False, frame_before=None, frame_entry=False, dict_put=False,
              list_over=None, size_str=None):
        if frame_entry:
            frame_start()
        a.w(b'}')
        if dict_put:
            a.w(b'q' + bytes([a.n]))
            a.n += 1
        else:
            a.memoize()
        a.w(b'(')
        e = {}
        for key in order:
            kt = a.s(key)
            if frame_before == key:  # a FRAME between the key and its value
                frame_start()
            if key == 'action':
                e[kt] = a.s(['alloc', 'free_requested', 'free_completed'][k % 3])
            elif key == 'addr':
                e[kt] = a.int_(0x10000 + 512 * k)
            elif key == 'size':
                if size_str is not None:
                    e[kt] = a.s(size_str, fresh=True)
                    a.b[-1:] = b'r' + a.memo[('s', 'addr')].to_bytes(4, 'little')  # put over 'addr', not MEMOIZE
                    a.n -= 1
                    a.memo[('s', size_str)] = a.memo[('s', 'addr')]
                else:
                    e[kt] = a.int_(2**40 + k)
            elif key == 'frames':
                e[kt] = frames(fr, define=define, put_over=list_over)
            elif key == 'compile_context':
                e[kt] = a.s('ctx%d' % k, fresh=True)
            elif key == 'pool_id':
                a.w(b'K\x00K\x00\x86')
                a.memoize()
                e[kt] = (0, 0)
        a.w(b'u')
        frame_end()
        entries.append(e)

    a.w(b'}'); a.memoize(); a.w(b'(')
    a.s('device_traces')
    a.w(b']'); a.memoize()
    a.w(b']'); a.memoize()
    a.w(b'(')
    entry(0, ORDER_A, define=True)
    a.w(b'e(')
    entry(1, ORDER_A)
    entry(2, ORDER_A)
    entry(3, ORDER_A, fr=(0,))
    entry(4, ORDER_A, fr=())
    entry(5, ORDER_A, frame_before='addr')
    entry(6, ORDER_A, frame_entry=True)
    entry(7, ORDER_A)
    entry(8, ORDER_B)
    entry(9, ORDER_B, fr=(1, 0))
    entry(10, ORDER_B)
    a.w(b'e(')
    entry(11, ORDER_B)
    entry(12, ['action', 'addr', 'size'], size_str='x')
    # E13: order B's bytes, the addr key by its old reference (now 'x')
    a.memo[('s', 'addr')] = a.memo[('s', 'x')]
    entry(13, ORDER_B)
    entries[-1] = {('x' if key == 'addr' else key): v for key, v in entries[-1].items()}
    del a.memo[('s', 'addr')]
    entry(14, ORDER_B)
    entry(15, ORDER_B)
    entry(16, ORDER_B, fr=(1,))
    entry(17, ORDER_B)
    entry(18, ORDER_C)
    entry(19, ORDER_C)
    entry(20, ORDER_C, fr=())
    entry(21, ORDER_C, dict_put=True)
    entry(22, ORDER_C)
    entry(23, ORDER_B)
    entry(24, ORDER_C)
    entry(25, ORDER_C, list_over=a.last_list)
    entry(26, ORDER_C)
    a.w(b'e')  # the device's list
    a.w(b'a')  # into device_traces
    a.s('segments'); a.w(b']'); a.memoize()
    a.w(b'u.')
    data = bytes(a.b)
    value = pickle.loads(data)
    assert value == {'device_traces': [entries], 'segments': []}, (value, entries)
    return data, entries

# torch_p4's records (its entries from the 1001st) read by a template: all
# but the first of each shape (nine keys, six) and those with a FRAME
# between their EMPTY_DICT and their SETITEMS (where Python's framing put
# one: FastPairs reads through FRAMEs, the templates do not). The pickle's
# stack is followed to find each entry's opcodes.
def torch_template_records(data):
    ops = list(pickletools.genops(data))
    stack, memo, frames_at, spans = [], [], [], []
    lists = 0  # EMPTY_LISTs after the key device_traces: its list, then device 0's
    seen_key = False
    dev = None
    for i, (op, arg, pos) in enumerate(ops):
        n = op.name
        if n == 'FRAME':
            frames_at.append(i)
        elif n == 'MARK':
            stack.append('mark')
        elif n == 'MEMOIZE':
            memo.append(stack[-1])
        elif n in ('BINGET', 'LONG_BINGET'):
            stack.append(memo[arg])
        elif n in ('EMPTY_DICT', 'EMPTY_LIST'):
            c = {'start': i, 'end': None}
            if n == 'EMPTY_LIST' and seen_key:
                lists += 1
                if lists == 2:
                    dev = c
            stack.append(c)
        elif n in ('SETITEMS', 'APPENDS'):
            k = len(stack) - 1 - stack[::-1].index('mark')
            items = stack[k + 1:]
            del stack[k:]
            if n == 'SETITEMS':
                stack[-1]['end'] = i
            elif stack[-1] is dev:
                spans += [(c['start'], c['end']) for c in items]
        elif n in ('SETITEM', 'APPEND'):
            del stack[-2 if n == 'SETITEM' else -1:]
        elif n.startswith('TUPLE') and n != 'TUPLE':
            del stack[len(stack) - int(n[-1]):]
            stack.append('v')
        elif n not in ('PROTO', 'STOP'):
            if n == 'SHORT_BINUNICODE' and arg == 'device_traces':
                seen_key = True
            stack.append('v')
    entries = pickle.loads(data)['device_traces'][0]
    assert len(spans) == len(entries)
    shapes, count = set(), 0
    for e, (a, b) in zip(entries[1000:], spans[1000:]):
        shape = tuple(e)
        framed = any(a < f < b for f in frames_at)
        if shape in shapes and not framed:
            count += 1
        shapes.add(shape)
    return count
with open(os.path.join(out, 'torch_p4.pickle'), 'rb') as f:
    write('torch_template.txt', str(torch_template_records(f.read())))

# A POP that uncovers an entry the fast path read (E1, then E2 popped), and
# a SETITEMS into it: Python adds the pair to E1; the reader refuses the POP
# (the fast path has finished E1, the general path has not).
e = lambda i: b'}' + put(10 + i) + b'(' + ustr('action') + ustr('alloc') + b'u'
pp = b'\x80\x04}' + put(0) + b'(' + ustr('device_traces') + b']' + put(1) + b']' + put(2) + b'('
pp += e(0) + b'e('
pp += e(1) + e(2) + b'0(' + ustr('size') + b'K\x07ue' + b'a' + b'u.'
assert pickle.loads(pp) == {'device_traces': [[{'action': 'alloc'}, {'action': 'alloc', 'size': 7}]]}
with open(os.path.join(out, 'pop_p4.pickle'), 'wb') as f:
    f.write(pp)
write('pop_offset.txt', str(pp.index(b'0(')))

data, tentries = template_pickle()
with open(os.path.join(out, 'tmpl_p4.pickle'), 'wb') as f:
    f.write(data)
write('tmpl.canon', '\n'.join(canon(e) for e in tentries) + '\n')

# Frames lists of 16 bytes of BINGETs and more, which a template finds by
# their first 16 bytes (PrefixCachedList: the list cached last with them):
# the same bytes again (E1, E7), the same length and first 16 with other
# items after them (E2: by all its bytes, cached), a list found by all its
# bytes after another with its first 16 was cached (E3, E5, E9), longer
# (E4) and shorter (E6, E8: its APPENDS before the cached one's). Every list
# starts with the same 8 frames. The frame dicts are pickled first (BINGETs
# of one byte: a frame is 2 bytes). (After a first batch of 1000 entries:
# the list is streamed from its second batch.)
ppool = [{'filename': 'p%d.py' % k, 'line': k} for k in range(20)]
def pentry(k, fr):
    return {'action': 'alloc', 'addr': 4096 * k, 'size': 512, 'stream': 0, 'time_us': 1000 + k,
            'frames': [ppool[j] for j in fr]}
pentries = [pentry(k, ()) for k in range(1000)] + [pentry(0, range(10)), pentry(1, range(10)), pentry(2, list(range(8)) + [15, 16]), pentry(3, range(10)),
            pentry(4, range(12)), pentry(5, range(10)), pentry(6, range(8)), pentry(7, range(8)),
            pentry(8, range(9)), pentry(9, range(12))]
# A memo reference whose id has bit (id % 64) of a memo write of its entry
# keeps its list out of the cache (the reader's bloom of its writes): pad
# strings before the entries move their ids clear of the frames' ids.
def pmemo_ids(data):
    ids, n, start = [], 0, data.index(b'\x8c\x06action')
    for op, arg, pos in pickletools.genops(data):
        if op.name == 'MEMOIZE':
            if pos > start:
                ids.append(n)
            n += 1
    return ids
for pad in range(64):
    pdata = pickle.dumps({'pool': ppool, 'pad': ['pad%d' % k for k in range(pad)], 'device_traces': [pentries],
                          'segments': []}, protocol=4)
    written = {i % 64 for i in pmemo_ids(pdata)[-2 * 10:]}
    if not written & {(2 * j + 3) % 64 for j in range(20)}:
        break
else:
    raise AssertionError('no padding')
with open(os.path.join(out, 'prefix_p4.pickle'), 'wb') as f:
    f.write(pdata)
write('prefix.canon', '\n'.join(canon(e) for e in pentries) + '\n')
)PY";

// Canon's text of `v`, appended to `out` (one string for the whole value:
// the equivalence tests canonicalise every entry of 40,000-entry files).
void CanonTo(const PyView& v, std::string& out) {
  auto hex = [&out](char tag, std::string_view bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    out += tag;
    absl::StrAppend(&out, bytes.size(), ":");
    // In chunks through a buffer (the sanitizer build is unoptimised: no
    // per-character string calls).
    char buffer[256];
    while (!bytes.empty()) {
      const std::size_t n = std::min(bytes.size(), sizeof buffer / 2);
      for (std::size_t i = 0; i < n; ++i) {
        const auto c = static_cast<unsigned char>(bytes[i]);
        buffer[2 * i] = kDigits[c >> 4];
        buffer[2 * i + 1] = kDigits[c & 15];
      }
      out.append(buffer, 2 * n);
      bytes.remove_prefix(n);
    }
  };
  switch (v.kind()) {
    case PyKind::kMissing: out += '?'; return;
    case PyKind::kNone: out += 'N'; return;
    case PyKind::kBool: out += v.bool_value() ? 'T' : 'F'; return;
    case PyKind::kInt:
      if (v.is_unsigned()) {
        absl::StrAppend(&out, "i", *v.AsUInt(), ";");
      } else {
        absl::StrAppend(&out, "i", *v.AsInt(), ";");
      }
      return;
    case PyKind::kFloat: absl::StrAppend(&out, "f", std::bit_cast<std::uint64_t>(v.float_value()), ";"); return;
    case PyKind::kString: hex('s', v.bytes()); return;
    case PyKind::kBytes: hex('b', v.bytes()); return;
    case PyKind::kList:
    case PyKind::kTuple:
      out += v.is_list() ? '[' : '(';
      for (std::size_t k = 0; k < v.size(); ++k) {
        if (k) out += ',';
        CanonTo(v[k], out);
      }
      out += v.is_list() ? ']' : ')';
      return;
    case PyKind::kDict:
      out += '{';
      for (std::size_t k = 0; k < v.size(); ++k) {
        if (k) out += ',';
        CanonTo(v.key(k), out);
        out += ':';
        CanonTo(v.value(k), out);
      }
      out += '}';
      return;
  }
  out += '?';
}

std::string Canon(const PyView& v) {
  std::string r;
  CanonTo(v, r);
  return r;
}

std::string ReadText(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> r;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) r.push_back(line);
  return r;
}

// The generated files, made once for all test cases and removed at exit.
using Fixture = memscope::testing::PythonGenerated;

const Fixture& Files() {
  static Fixture f("pickle_reader_test", kGenerator);
  return f;
}

absl::StatusOr<PickleDoc> ReadFile(const std::filesystem::path& p, const PickleReadOptions& o = {},
                                   PickleReadStats* stats = nullptr) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  return ReadPickle(in, p.filename().string(), o, stats);
}

// Bytes at the very end of readable memory: the page after them is
// PROT_NONE, so that a read beyond their end crashes the test.
class Guarded {
 public:
  explicit Guarded(std::string_view bytes) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    size_ = (bytes.size() + page - 1) / page * page + page;
    void* m = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    base_ = static_cast<char*>(m);
    REQUIRE(mprotect(base_ + size_ - page, page, PROT_NONE) == 0);
    char* at = base_ + size_ - page - bytes.size();
    if (!bytes.empty()) std::memcpy(at, bytes.data(), bytes.size());
    view_ = std::string_view(at, bytes.size());
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { munmap(base_, size_); }
  std::string_view view() const { return view_; }

 private:
  char* base_ = nullptr;
  std::size_t size_ = 0;
  std::string_view view_;
};

bool SameStats(const PickleReadStats& a, const PickleReadStats& b) {
  return a.input_bytes == b.input_bytes && a.peak_working_bytes == b.peak_working_bytes &&
         a.shared_containers == b.shared_containers && a.fast_dicts == b.fast_dicts && a.records == b.records &&
         a.template_records == b.template_records;
}

// What a read gave: the tree (canonical text) or the error.
std::string Outcome(const absl::StatusOr<PickleDoc>& v) {
  return v.ok() ? "ok " + Canon(v->root()) : v.status().ToString();
}

// Reads `bytes` from a stream and, with the same options, in place
// (ReadPickleBytes, before a guard page): the same tree, error and stats
// either way (`o`'s callbacks are called twice). The stream's read.
absl::StatusOr<PickleDoc> ReadBytes(const std::string& bytes, const PickleReadOptions& o = {},
                                    PickleReadStats* stats = nullptr) {
  std::istringstream in(bytes);
  PickleReadStats streamed, in_place;
  absl::StatusOr<PickleDoc> v = ReadPickle(in, "mem.pickle", o, &streamed);
  {
    const Guarded g(bytes);
    const absl::StatusOr<PickleDoc> w = ReadPickleBytes(g.view(), "mem.pickle", o, &in_place);
    CHECK(Outcome(w) == Outcome(v));
  }
  CHECK(SameStats(in_place, streamed));
  CHECK(!streamed.mapped);
  CHECK(!in_place.mapped);
  if (stats != nullptr) *stats = streamed;
  return v;
}

}  // namespace

TEST_CASE("pickle_reader: Python's pickles of a 2.x snapshot read back exactly") {
  const Fixture& f = Files();
  std::string expected = ReadText(f / "snap.canon");
  for (int p = 0; p <= 5; ++p) {
    INFO("protocol " << p);
    absl::StatusOr<PickleDoc> v = ReadFile(f / absl::StrCat("snap_p", p, ".pickle"));
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    CHECK(Canon(v->root()) == expected);
    // Helpers.
    const PyView root = v->root();
    REQUIRE(root.Get("segments").valid());
    CHECK(root.Get("segments").size() == 30);
    CHECK(!root.Get("nope").valid());
    const PyView ints = root.Get("misc").Get("ints");
    REQUIRE(ints.valid());
    CHECK(ints[11].AsInt() == INT64_MAX);
    CHECK(ints[13].AsUInt() == UINT64_MAX);
    CHECK(!ints[13].AsInt());
    CHECK(ints[23].AsInt() == INT64_MIN);
    CHECK(!ints[23].AsUInt());
    CHECK(root.Get("misc").Get("bools")[0].AsInt() == 1);
    const PyView t0 = root.Get("device_traces")[0][0];
    REQUIRE(t0.Get("action").AsString());
    CHECK(t0.Get("addr").AsUInt() == 0x7f0000000000u);
  }
}

TEST_CASE("pickle_reader: streamed device_traces hand on_item each entry, with or without streaming inside it") {
  const Fixture& f = Files();
  std::vector<std::string> traces0 = Lines(ReadText(f / "traces0.canon"));
  REQUIRE(traces0.size() == 2600);
  std::set<std::string> frames0;
  {
    std::istringstream in(ReadText(f / "frames0.txt"));
    for (std::string k; in >> k;) frames0.insert(absl::StrCat("[", k, "]"));
  }
  for (int p : {0, 1, 2, 3, 4, 5}) {
    INFO("protocol " << p);
    std::vector<std::string> got;
    std::vector<PicklePath> asked;
    PickleReadOptions o;
    o.stream_list = [&](const PicklePath& path) {
      asked.push_back(path);
      return path == PicklePath{"device_traces", "[0]"};
    };
    o.on_item = [&](const PicklePath& path, PyView item) {
      CHECK(path == PicklePath{"device_traces", "[0]"});
      got.push_back(Canon(item));
      return absl::OkStatus();
    };
    absl::StatusOr<PickleDoc> v = ReadFile(f / absl::StrCat("snap_p", p, ".pickle"), o);
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    CHECK(got == traces0);
    CHECK(v->root().Get("device_traces")[0].size() == 0);
    CHECK(Canon(v->root()) == ReadText(f / "streamed0.canon"));
    // The paths seen are those of the snapshot's lists.
    std::set<PicklePath> seen(asked.begin(), asked.end());
    CHECK(seen.count({"segments"}) == 1);
    CHECK(seen.count({"segments", "[0]", "blocks"}) == 1);
    CHECK(seen.count({"segments", "[29]", "blocks"}) == 1);
    CHECK(seen.count({"device_traces"}) == 1);
    CHECK(seen.count({"device_traces", "[2]"}) == 1);
    CHECK(seen.count({"device_traces", "[1]"}) == 0);  // empty: never appended to
    CHECK(seen.count({"external_annotations"}) == 1);
    CHECK(seen.count({"misc", "ints"}) == 1);
    std::set<std::string> with_frames;
    for (const PicklePath& path : asked) {
      if (path.size() == 4 && path[0] == "device_traces" && path[1] == "[0]" && path[3] == "frames") {
        with_frames.insert(path[2]);
      }
    }
    CHECK(with_frames == frames0);
  }
  // As the snapshot importer reads (stream_inside_items = false): the same
  // items and tree, and stream_list is not asked about the lists inside the
  // streamed entries' batches once the list is known to be streamed: after
  // its first batch of 1000 (protocol 0 has no batches: APPEND per item, so
  // there every frames list is still asked about).
  for (int p : {0, 1, 2, 3, 4, 5}) {
    INFO("protocol " << p);
    std::vector<std::string> got;
    std::vector<PicklePath> asked;
    PickleReadOptions o;
    o.stream_inside_items = false;
    o.stream_list = [&](const PicklePath& path) {
      asked.push_back(path);
      return path == PicklePath{"device_traces", "[0]"};
    };
    o.on_item = [&](const PicklePath& path, PyView item) {
      CHECK(path == PicklePath{"device_traces", "[0]"});
      got.push_back(Canon(item));
      return absl::OkStatus();
    };
    absl::StatusOr<PickleDoc> v = ReadFile(f / absl::StrCat("snap_p", p, ".pickle"), o);
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    CHECK(got == traces0);
    CHECK(Canon(v->root()) == ReadText(f / "streamed0.canon"));
    std::set<std::string> with_frames;
    for (const PicklePath& path : asked) {
      if (path.size() > 2 && path[0] == "device_traces" && path[1] == "[0]") with_frames.insert(path[2]);
    }
    std::set<std::string> first_batch;
    for (const std::string& k : frames0) {
      if (std::stoi(k.substr(1)) < 1000) first_batch.insert(k);
    }
    CHECK(!first_batch.empty());
    CHECK(first_batch.size() < frames0.size());
    CHECK(with_frames == (p == 0 ? frames0 : first_batch));
    std::set<PicklePath> seen(asked.begin(), asked.end());
    CHECK(seen.count({"device_traces", "[2]"}) == 1);
    CHECK(seen.count({"segments", "[0]", "blocks"}) == 1);
  }
}

TEST_CASE("pickle_reader: another device and a one-device snapshot stream too, and an error from on_item stops the read") {
  const Fixture& f = Files();
  std::vector<std::string> traces0 = Lines(ReadText(f / "traces0.canon"));
  std::vector<std::string> traces2 = Lines(ReadText(f / "traces2.canon"));
  // Another device, and a one-device snapshot (its list is APPENDed alone).
  for (int p : {2, 4}) {
    INFO("protocol " << p);
    std::vector<std::string> got;
    PickleReadOptions o;
    o.stream_list = [](const PicklePath& path) { return path == PicklePath{"device_traces", "[2]"}; };
    o.on_item = [&](const PicklePath&, PyView item) {
      got.push_back(Canon(item));
      return absl::OkStatus();
    };
    absl::StatusOr<PickleDoc> v = ReadFile(f / absl::StrCat("snap_p", p, ".pickle"), o);
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    CHECK(got == traces2);
    CHECK(v->root().Get("device_traces")[0].size() == 2600);

    got.clear();
    o.stream_list = [](const PicklePath& path) { return path == PicklePath{"device_traces", "[0]"}; };
    v = ReadFile(f / absl::StrCat("single_p", p, ".pickle"), o);
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    CHECK(got == traces0);
    REQUIRE(v->root().Get("device_traces").size() == 1);
    CHECK(v->root().Get("device_traces")[0].size() == 0);
  }
  // An error from on_item stops the read.
  PickleReadOptions o;
  o.stream_list = [](const PicklePath& path) { return path.size() == 2; };
  int n = 0;
  o.on_item = [&](const PicklePath&, PyView) { return ++n == 10 ? absl::CancelledError("enough") : absl::OkStatus(); };
  absl::StatusOr<PickleDoc> v = ReadFile(f / "snap_p4.pickle", o);
  CHECK(absl::IsCancelled(v.status()));
  CHECK(n == 10);
}

TEST_CASE("pickle_reader: bytes and bytearray") {
  const Fixture& f = Files();
  absl::StatusOr<PickleDoc> v = ReadFile(f / "bytes_p5.pickle");
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  CHECK(Canon(v->root()) == ReadText(f / "bytes.canon"));
  v = ReadFile(f / "bytes_p3.pickle");
  REQUIRE(v.ok());
  CHECK(Canon(v->root()) == ReadText(f / "bytes3.canon"));
  v = ReadFile(f / "bytes_p2.pickle");
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()), Catch::Contains("GLOBAL (c)"));
}

TEST_CASE("pickle_reader: PyTorch 1.13 list format") {
  const Fixture& f = Files();
  for (int p : {2, 4}) {
    absl::StatusOr<PickleDoc> v = ReadFile(f / absl::StrCat("legacy_p", p, ".pickle"));
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    CHECK(Canon(v->root()) == ReadText(f / "legacy.canon"));
    REQUIRE(v->root().is_list());
    CHECK(v->root()[0].Get("blocks")[0].Get("history").size() == 1);
  }
}

TEST_CASE("pickle_reader: objects and code are refused, naming the opcode") {
  const Fixture& f = Files();
  absl::StatusOr<PickleDoc> v = ReadFile(f / "ordered_p2.pickle");
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()),
             Catch::Contains("opcode GLOBAL (c) builds objects or calls code: refused"));
  CHECK_THAT(std::string(v.status().message()), Catch::StartsWith("ordered_p2.pickle: offset 2:"));
  v = ReadFile(f / "ordered_p4.pickle");
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()), Catch::Contains("opcode STACK_GLOBAL (0x93)"));

  std::istringstream evil(std::string("cos\nsystem\n(S'echo hi'\ntR."));
  v = ReadPickle(evil, "trace.pickle");
  REQUIRE(!v.ok());
  CHECK(v.status().message() == "trace.pickle: offset 0: opcode GLOBAL (c) builds objects or calls code: refused");
  // A REDUCE after data.
  v = ReadBytes(std::string("\x80\x02K\x01K\x02R.", 8));
  REQUIRE(!v.ok());
  CHECK(v.status().message() == "mem.pickle: offset 6: opcode REDUCE (R) builds objects or calls code: refused");
  for (const char* op : {"b", "i", "o", "\x81", "\x92", "\x82", "\x83", "\x84", "P", "Q", "\x97", "\x98"}) {
    v = ReadBytes(std::string("\x80\x05N") + op + ".");
    REQUIRE(!v.ok());
    CHECK_THAT(std::string(v.status().message()), Catch::Contains("builds objects or calls code: refused"));
  }
}

TEST_CASE("pickle_reader: memo references to shared containers are the same value again") {
  const Fixture& f = Files();
  absl::StatusOr<PickleDoc> v = ReadFile(f / "shared_nested.pickle");
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  CHECK(Canon(v->root()) == ReadText(f / "shared_nested.canon"));
  // One node, referred to twice (not a copy).
  CHECK(std::memcmp(&v->root()[0].ref(), &v->root()[1].ref(), sizeof(PyRef)) == 0);
  v = ReadFile(f / "recursive.pickle");
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()), Catch::Contains("recursive"));
  v = ReadBytes("\x80\x04h\x05.");
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()),
             Catch::StartsWith("mem.pickle: offset 2: bad memo reference 5 (no such entry"));
}

TEST_CASE("pickle_reader: memo ids in any order, sparse, overwritten") {
  const auto le32 = [](std::uint32_t v) {
    std::string b(4, '\0');
    for (int k = 0; k < 4; ++k) b[k] = static_cast<char>((v >> (8 * k)) & 0xff);
    return b;
  };
  // (1, 7, 9, 8, 7, 9, 8, 1, 5, 5, [1, 2], [1, 2]): ids 0, 5000 (ahead of the input read so far), 4500 and
  // 4600 (read later), 4000000000, and id 0 written again.
  const auto byte = [](unsigned v) { return std::string(1, static_cast<char>(v)); };
  std::string b = "\x80" + byte(2) + "(K" + byte(1) + "q" + byte(0) + "K" + byte(7) + "r" + le32(5000);
  b += "X" + le32(10000) + std::string(10000, 'a') + "0";  // a string, popped: 10 kB more input
  b += "K" + byte(9) + "r" + le32(4500) + "K" + byte(8) + "r" + le32(4600);
  b += "j" + le32(5000) + "j" + le32(4500) + "j" + le32(4600) + "h" + byte(0);
  b += "K" + byte(5) + "r" + le32(4000000000u) + "j" + le32(4000000000u);
  b += "]q" + byte(0) + "(K" + byte(1) + "K" + byte(2) + "eh" + byte(0) + "t.";
  absl::StatusOr<PickleDoc> v = ReadBytes(b);
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  const PyView t = v->root();
  REQUIRE(t.kind() == PyKind::kTuple);
  REQUIRE(t.size() == 12);
  const std::int64_t want[] = {1, 7, 9, 8, 7, 9, 8, 1, 5, 5};
  for (std::size_t k = 0; k < 10; ++k) CHECK(t[k].AsInt() == want[k]);
  for (std::size_t k : {10u, 11u}) {
    REQUIRE(t[k].is_list());
    REQUIRE(t[k].size() == 2);
    CHECK(t[k][0].AsInt() == 1);
    CHECK(t[k][1].AsInt() == 2);
  }
}

TEST_CASE("pickle_reader: malformed input") {
  const Fixture& f = Files();
  PickleReadOptions shallow;
  shallow.max_depth = 10;
  absl::StatusOr<PickleDoc> v = ReadFile(f / "deep.pickle", shallow);
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()), Catch::Contains("max_depth"));
  CHECK(ReadFile(f / "deep.pickle").ok());

  CHECK(!ReadBytes("").ok());
  CHECK(!ReadBytes("\x80\x06N.").ok());         // protocol 6
  CHECK(!ReadBytes("\x80\x04\xff.").ok());      // unknown opcode
  CHECK(!ReadBytes("a.").ok());                 // stack underflow
  CHECK(!ReadBytes("NN.").ok());                // two values at STOP
  CHECK(!ReadBytes("(N.").ok());                // MARK left open
  CHECK(!ReadBytes("\x8c\x02\xc3\x28.").ok());  // invalid UTF-8
  CHECK(!ReadBytes("X\xff\xff\xff\xff"
                   "abc.")
             .ok());  // length beyond the input
  CHECK(!ReadBytes("\x8d\xff\xff\xff\xff\xff\xff\xff\xff.").ok());
  CHECK(!ReadBytes("}]N.").ok());   // unhashable key... no SETITEM: 3 values
  CHECK(!ReadBytes("}]Ns.").ok());  // unhashable key
  CHECK(!ReadBytes("\x8a\x0a\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01.").ok());  // 2^72

  // Paths of nested one-element lists deeper than max_depth: error, no crash.
  PickleReadOptions streaming;
  streaming.stream_list = [](const PicklePath&) { return false; };
  std::string chain = std::string(100000, ']') + "N" + std::string(100000, 'a') + ".";
  v = ReadBytes(chain, streaming);
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()), Catch::Contains("max_depth"));
  v = ReadBytes(std::string(100000, '(') + ".");
  CHECK(!v.ok());

  // Protocol 0 text opcodes and duplicate keys.
  v = ReadBytes("(dp0\nVk\np1\nI5\nsg1\nL7L\nsS'a\\x41\\n'\nF2.5\ns.");
  REQUIRE(v.ok());
  REQUIRE(v->root().size() == 2);
  CHECK(v->root().Get("k").AsInt() == 7);
  CHECK(v->root().key(1).kind() == PyKind::kBytes);
  CHECK(v->root().key(1).bytes() == "aA\n");
  CHECK(v->root().value(1).float_value() == 2.5);
}

TEST_CASE("pickle_reader: truncation at every offset is an error") {
  const Fixture& f = Files();
  for (int p : {2, 4}) {
    std::string bytes = ReadText(f / absl::StrCat("small_p", p, ".pickle"));
    INFO(ReadBytes(bytes).status().ToString());
    REQUIRE(ReadBytes(bytes).ok());
    PickleReadOptions o;
    o.stream_list = [](const PicklePath& path) { return path.size() == 2; };
    o.on_item = [](const PicklePath&, PyView) { return absl::OkStatus(); };
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      INFO("protocol " << p << " truncated to " << n);
      absl::StatusOr<PickleDoc> v = ReadBytes(bytes.substr(0, n));
      CHECK(!v.ok());
      CHECK_THAT(std::string(v.status().message()), Catch::StartsWith("mem.pickle: offset "));
      CHECK(!ReadBytes(bytes.substr(0, n), o).ok());
    }
  }
}

TEST_CASE("pickle_reader: corrupted bytes give an error or a value, never a crash") {
  const Fixture& f = Files();
  int errors = 0, values = 0;
  for (int p : {2, 4}) {
    std::string bytes = ReadText(f / absl::StrCat("small_p", p, ".pickle"));
    for (unsigned seed = 0; seed < 3000; ++seed) {
      std::mt19937 rng(seed);
      std::string b = bytes;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) {
        b[rng() % b.size()] = static_cast<char>(rng() % 256);
      }
      PickleReadOptions o;
      if (seed % 2) {
        o.stream_list = [](const PicklePath& path) { return path.size() % 2 == 0; };
        o.on_item = [](const PicklePath&, PyView) { return absl::OkStatus(); };
      }
      absl::StatusOr<PickleDoc> v = ReadBytes(b, o);
      (v.ok() ? values : errors)++;
    }
  }
  CHECK(errors > 0);
  CHECK(errors + values == 6000);
}

TEST_CASE(
    "pickle_reader: a snapshot in PyTorch's shape: shared frames lists read, stacks stored once, items released") {
  const Fixture& f = Files();
  std::vector<std::string> entries;
  std::size_t n = 0;
  PickleReadOptions o;
  o.stream_list = [](const PicklePath& path) { return path == PicklePath{"device_traces", "[0]"}; };
  o.on_item = [&](const PicklePath&, PyView item) {
    if (n < 3 || n == 39999) entries.push_back(Canon(item));  // the first three and the last
    ++n;
    return absl::OkStatus();
  };
  PickleReadStats stats;
  absl::StatusOr<PickleDoc> v = ReadFile(f / "torch_p4.pickle", o, &stats);
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  CHECK(n == 40000);  // 20000 allocs, 10000 free_requested + free_completed pairs
  CHECK(entries == Lines(ReadText(f / "torch_entry.canon")));
  CHECK(Canon(v->root().Get("segments")) == ReadText(f / "torch_segments.canon"));
  // 60 frame dicts, 50 stacks and the pool_id tuple are stored once each:
  // the distinct containers, not one per entry.
  CHECK(stats.shared_containers <= 60 + 50 + 2);
  // What the streamed entries built is released after each batch: the reader
  // holds far less than the input (which is what a tree of the entries would take).
  INFO("input " << stats.input_bytes << " peak " << stats.peak_working_bytes);
  CHECK(stats.peak_working_bytes < stats.input_bytes);
}

TEST_CASE("pickle_reader: hostile shapes are refused before they cost memory") {
  PickleReadStats stats;
  // 10^7 nested lists: refused when the 1001st is pushed.
  absl::StatusOr<PickleDoc> v =
      ReadBytes("\x80\x04" + std::string(10000000, ']') + "N" + std::string(10000000, 'a') + ".", {}, &stats);
  REQUIRE(!v.ok());
  CHECK(v.status().message() == "mem.pickle: offset 1002: nesting deeper than max_depth (1000)");
  CHECK(stats.peak_working_bytes < (1u << 20));
  // 10^7 empty lists waiting in one batch: refused at the stack's cap.
  v = ReadBytes("\x80\x04(" + std::string(10000000, ']') + "l.", {}, &stats);
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()),
             Catch::StartsWith("mem.pickle: offset 131074: more than 131072 values waiting on the pickle stack"));
  CHECK(stats.peak_working_bytes < (64u << 20));
  // MARKs nest too.
  v = ReadBytes("\x80\x04" + std::string(10000000, '('), {}, &stats);
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()), Catch::Contains("max_depth"));
  // A valid list of 10^6 ints in batches of 1000 within a budget of 1 MiB +
  // 2 bytes per input byte: each 2-byte BININT1 becomes a 16-byte element.
  std::string ints = "\x80\x04](";
  for (int k = 0; k < 1000000; ++k) {
    ints += "K\x01";
    if (k % 1000 == 999) ints += "e(";
  }
  ints += "e.";
  PickleReadOptions tight;
  tight.max_working_bytes_fixed = 1 << 20;
  tight.max_working_bytes_per_input_byte = 2;
  v = ReadBytes(ints, tight, &stats);
  REQUIRE(!v.ok());
  CHECK_THAT(std::string(v.status().message()),
             Catch::Contains("needs more than 2 bytes of working memory per byte of input"));
  // The default budget (256 MiB + 16 per byte) reads it.
  v = ReadBytes(ints, {}, &stats);
  REQUIRE(v.ok());
  CHECK(v->root().size() == 1000000);
  CHECK(stats.peak_working_bytes <= 16 * stats.input_bytes + (1u << 20));
}

// The dict a record stands for, as Canon writes it.
std::string CanonRecord(const PickleRecord& r) {
  std::string out = "{";
  for (std::uint32_t k = 0; k < r.n; ++k) {
    if (k) out += ',';
    out += Canon(r.key(k)) + ":" + Canon(r.value(k));
  }
  return out + "}";
}

const std::vector<std::string> kTorchKeys = {
    "action", "addr", "size", "stream", "time_us", "frames", "compile_context", "user_metadata", "pool_id"};

// A read that streams the list at root[list] (each item to on_item, or to
// on_record when `record_keys` is given), with `o`'s other options: the
// items as read (canonical text), which were records, the tree, the error.
struct StreamedRead {
  std::vector<std::string> items;
  std::vector<bool> as_record;
  std::string root;
  std::string error;
  PickleReadStats stats;
};
enum class Input { kStream, kInPlace, kMapped };
StreamedRead ReadStreamedFrom(Input input, const std::filesystem::path& file, PickleReadOptions o,
                              const std::string& list, const std::vector<std::string>* record_keys) {
  StreamedRead r;
  o.stream_inside_items = false;
  o.stream_list = [&](const PicklePath& path) { return path.size() == 2 && path[1] == list; };
  o.on_item = [&](const PicklePath&, PyView item) {
    r.items.push_back(Canon(item));
    r.as_record.push_back(false);
    return absl::OkStatus();
  };
  if (record_keys != nullptr) {
    o.record_keys = *record_keys;
    o.on_record = [&](const PicklePath& path, const PickleRecord& rec) {
      CHECK(path.size() == 2);
      r.items.push_back(CanonRecord(rec));
      r.as_record.push_back(true);
      for (std::uint32_t k = 0; k < rec.n; ++k) CHECK(rec.key(k).AsString() == (*record_keys)[rec.key_index[k]]);
      return absl::OkStatus();
    };
  }
  absl::StatusOr<PickleDoc> v;
  if (input == Input::kStream) {
    v = ReadFile(file, o, &r.stats);
  } else if (input == Input::kInPlace) {
    const Guarded g(ReadText(file));
    v = ReadPickleBytes(g.view(), file.filename().string(), o, &r.stats);
  } else {
    v = ReadPickleFile(file.string(), o, &r.stats);
    CHECK(r.stats.mapped);
  }
  if (v.ok()) {
    r.root = Canon(v->root());
  } else {
    r.error = v.status().ToString();
    if (input == Input::kMapped) {  // the file named as given: as the others name it
      const std::size_t at = r.error.find(file.string());
      REQUIRE(at != std::string::npos);
      r.error.replace(at, file.string().size(), file.filename().string());
    }
  }
  return r;
}

bool Same(const StreamedRead& a, const StreamedRead& b) {
  return a.items == b.items && a.as_record == b.as_record && a.root == b.root && a.error == b.error &&
         SameStats(a.stats, b.stats);
}

// ReadStreamedFrom a stream, and the same in place (before a guard page):
// both must read the same (items, records, tree, error, stats). (The mapped
// file is read in place too: "in place and mapped" below compares it.)
StreamedRead ReadStreamed(const std::filesystem::path& file, PickleReadOptions o, const std::string& list,
                          const std::vector<std::string>* record_keys) {
  StreamedRead r = ReadStreamedFrom(Input::kStream, file, o, list, record_keys);
  const StreamedRead in_place = ReadStreamedFrom(Input::kInPlace, file, o, list, record_keys);
  INFO(file.filename().string() << ": " << r.error);
  CHECK(Same(in_place, r));
  return r;
}

// The trace-entry fast path reads what the general path reads: every item,
// the tree, the errors, on every protocol; and it does read the entries.
TEST_CASE("pickle_reader: the trace-entry fast path reads exactly what the general path reads") {
  const Fixture& f = Files();
  using Read = StreamedRead;
  auto read = [&](const std::string& name, bool fast, const std::string& list = "[0]") {
    PickleReadOptions o;
    o.fast_dicts = fast;
    return ReadStreamed(f / name, o, list, nullptr);
  };
  for (int p = 0; p <= 5; ++p) {
    INFO("protocol " << p);
    const std::string name = absl::StrCat("fast_p", p, ".pickle");
    const Read general = read(name, false), fast = read(name, true);
    CHECK(fast.error == general.error);
    CHECK(fast.items == general.items);
    if (p == 0) {
      // No batches in protocol 0 (APPEND per item): each entry is released
      // at once, so the entry written twice refers to a released one.
      CHECK(general.error.find("bad memo reference") != std::string::npos);
      CHECK(fast.stats.fast_dicts == 0);  // and no EMPTY_DICT (MARK ... DICT)
      continue;
    }
    INFO(fast.error);
    REQUIRE(fast.error.empty());
    REQUIRE(general.error.empty());
    REQUIRE(fast.items.size() == 3002);
    CHECK(fast.items[1750] == fast.items[1700]);
    CHECK(fast.items[1600] == fast.items[1599]);
    CHECK(fast.items == general.items);
    CHECK(fast.root == general.root);
    CHECK(general.stats.fast_dicts == 0);
    // Byte for byte what Python wrote, on a few entries read fast.
    CHECK(fast.items[1002].find("s5:616c6c6f63") != std::string::npos);  // 'alloc'
  }
  // Each protocol, exactly: the entries read fast are the 2002 after the
  // first batch (the list is known to be streamed from its first APPENDS)
  // less the 9 the general path takes: 1500, 1501, 1502 and 1504 (an int
  // key, 1200 frames, 40 pairs, a float key), 1503 (a list), the entries
  // written twice (1600 and 1750: BINGETs) and the entries before them
  // (what follows their SETITEMS is not another entry or APPENDS: they
  // might still grow). 1700 is read fast, and 1750 refers to it.
  for (int p : {2, 4, 5}) {
    INFO("protocol " << p);
    const Read fast = read(absl::StrCat("fast_p", p, ".pickle"), true);
    REQUIRE(fast.error.empty());
    CHECK(fast.stats.fast_dicts == 2002 - 9);
  }
  // A memo reference to an entry of an earlier batch (released after its
  // batch): the same one-line error, naming the offset, either way.
  for (int p : {2, 4, 5}) {
    INFO("protocol " << p);
    const std::string name = absl::StrCat("fast_err_p", p, ".pickle");
    const Read general = read(name, false), fast = read(name, true);
    CHECK(general.error.find("bad memo reference") != std::string::npos);
    CHECK(general.error.find(": offset ") != std::string::npos);
    CHECK(fast.error == general.error);
    CHECK(fast.items == general.items);
    CHECK(fast.items.size() == 3000);           // the last batch holds the bad reference
    CHECK(fast.stats.fast_dicts == 2002 - 10);  // and the entry before it is read generally
  }
  // A dict that holds itself: the same error either way.
  for (int p : {2, 4, 5}) {
    INFO("protocol " << p);
    const std::string name = absl::StrCat("fast_rec_p", p, ".pickle");
    const Read general = read(name, false), fast = read(name, true);
    CHECK(general.error.find("a container inside itself") != std::string::npos);
    CHECK(fast.error == general.error);
    CHECK(fast.items == general.items);
    CHECK(fast.items.size() == 2000);
  }
  // The other pickles of this file, streamed the same way, and the snapshot's
  // segments read whole: the same either way.
  for (const char* name : {"snap_p1.pickle", "snap_p2.pickle", "snap_p4.pickle", "snap_p5.pickle", "torch_p4.pickle",
                           "small_p2.pickle", "small_p4.pickle", "single_p2.pickle", "single_p4.pickle"}) {
    INFO(name);
    for (const char* list : {"[0]", "[2]"}) {
      const Read general = read(name, false, list), fast = read(name, true, list);
      CHECK(fast.error == general.error);
      CHECK(fast.items == general.items);
      CHECK(fast.root == general.root);
    }
  }
  const Read torch = read("torch_p4.pickle", true);
  CHECK(torch.items.size() == 40000);
  CHECK(torch.stats.fast_dicts == 40000 - 1000);  // every entry after the first batch
}

// How a records test reads a list: the general path, the fast dicts, or records.
enum class How { kGeneral, kFast, kRecords };

// Streams `list` of the test pickle `name` as `how` says (records of `keys`).
StreamedRead ReadAs(const std::string& name, How how, const std::string& list = "[0]",
                    const std::vector<std::string>& keys = kTorchKeys) {
  PickleReadOptions o;
  o.fast_dicts = how != How::kGeneral;
  return ReadStreamed(Files() / name, o, list, how == How::kRecords ? &keys : nullptr);
}

// Records (PickleReadOptions::on_record): the same items, in the same order,
// the same tree and errors as the dict paths; which entries become records.
TEST_CASE("pickle_reader: records read what the dict paths read, and entries of only the keys given become records") {
  using Read = StreamedRead;
  for (int p = 0; p <= 5; ++p) {
    INFO("protocol " << p);
    const std::string name = absl::StrCat("fast_p", p, ".pickle");
    const Read general = ReadAs(name, How::kGeneral), records = ReadAs(name, How::kRecords);
    CHECK(records.error == general.error);
    CHECK(records.items == general.items);
    CHECK(records.root == general.root);
    if (p < 2) {
      CHECK(records.stats.records == 0);
      continue;
    }
    REQUIRE(records.items.size() == 3002);
    // Entries 1000 to 3001 (after the first batch) of only the nine keys,
    // less those the fast path leaves to the general one (1599, 1600, 1749,
    // 1750: see above); 1700 is decoded as a record, then built as its dict
    // when 1750 refers to it, so on_item gets both. Python counts the
    // rest: 1,993 entries read fast, 646 of them with another key
    // (t, flags, big, neg, fresh).
    CHECK(records.stats.fast_dicts == 2002 - 9);
    CHECK(records.stats.records == 2002 - 9 - 646);
    std::size_t handed = 0;
    for (bool b : records.as_record) handed += b ? 1 : 0;
    CHECK(handed == records.stats.records - 1);
    CHECK(!records.as_record[1700]);
    CHECK(!records.as_record[1750]);
    CHECK(records.as_record[1699]);
    CHECK(records.as_record[1703]);
    CHECK(!records.as_record[1701]);  // 'neg'
    CHECK(!records.as_record[999]);   // the first batch: the list is not known to be streamed yet
    CHECK(!records.as_record[1001]);  // 1001 holds 't' (1001 % 7 == 0)
    CHECK(records.as_record[1002]);
  }
  // No record keys given, or keys the entries do not use: no records, the same items.
  {
    const Read general = ReadAs("fast_p4.pickle", How::kGeneral);
    const Read none = ReadAs("fast_p4.pickle", How::kRecords, "[0]", {"other"});
    CHECK(none.stats.records == 0);
    CHECK(none.stats.fast_dicts == 2002 - 9);
    CHECK(none.items == general.items);
    // More keys: the entries with t, big, neg or fresh become records too.
    std::vector<std::string> all = kTorchKeys;
    all.insert(all.end(), {"t", "flags", "big", "neg", "fresh"});
    const Read more = ReadAs("fast_p4.pickle", How::kRecords, "[0]", all);
    CHECK(more.items == general.items);
    // Python counts 1,811 of the 1,993 with only those keys: all but the
    // 182 with 'flags' (a list of scalars, tuples and dicts: not a list of
    // memo references, which a record takes).
    CHECK(more.stats.records == 1811);
  }
}

TEST_CASE("pickle_reader: records give the dict paths' errors and items on the other pickles, frames lists cached") {
  using Read = StreamedRead;
  // Errors: a memo reference to a released entry, a dict holding itself.
  for (int p : {2, 4, 5}) {
    INFO("protocol " << p);
    for (const char* base : {"fast_err_p", "fast_rec_p"}) {
      const std::string name = absl::StrCat(base, p, ".pickle");
      const Read general = ReadAs(name, How::kGeneral), fast = ReadAs(name, How::kFast),
                 records = ReadAs(name, How::kRecords);
      CHECK(!general.error.empty());
      CHECK(records.error == general.error);
      CHECK(records.error == fast.error);
      CHECK(records.items == general.items);
      CHECK(records.stats.records > 0);
    }
  }
  // The other pickles: the same either way.
  for (const char* name :
       {"snap_p1.pickle", "snap_p2.pickle", "snap_p4.pickle", "snap_p5.pickle", "torch_p4.pickle", "small_p2.pickle",
        "small_p4.pickle", "single_p2.pickle", "single_p4.pickle", "rec_imp_p2.pickle", "rec_imp_p4.pickle"}) {
    INFO(name);
    for (const char* list : {"[0]", "[2]"}) {
      const Read general = ReadAs(name, How::kGeneral, list), records = ReadAs(name, How::kRecords, list);
      CHECK(records.error == general.error);
      CHECK(records.items == general.items);
      CHECK(records.root == general.root);
    }
  }
  const Read torch = ReadAs("torch_p4.pickle", How::kRecords);
  CHECK(torch.items.size() == 40000);
  CHECK(torch.stats.records == 40000 - 1000);  // every entry after the first batch
  // The frames lists cache: the same bytes mean another list once the memo changed.
  {
    const Read general = ReadAs("list_cache_p4.pickle", How::kGeneral);
    const Read fast = ReadAs("list_cache_p4.pickle", How::kFast);
    const Read records = ReadAs("list_cache_p4.pickle", How::kRecords);
    REQUIRE(general.error.empty());
    CHECK(fast.error.empty());
    CHECK(records.error.empty());
    REQUIRE(general.items.size() == 9);
    CHECK(fast.items == general.items);
    CHECK(records.items == general.items);
    CHECK(records.stats.records == 7);                                          // 2 to 8 (0 and 1: the first batch)
    const std::string a = "{s8:66696c656e616d65:s4:612e7079,s4:6c696e65:i7;}";  // {'filename': 'a.py', 'line': 7}
    const std::string b = "{s8:66696c656e616d65:s4:622e7079,s4:6c696e65:i7;}";
    const std::string x = "s1:78", y = "s1:79";
    for (std::size_t k = 1; k <= 8; ++k) {
      INFO(k);
      const std::string frames = k < 4   ? "[" + a + "," + b + "]"
                                 : k < 7 ? "[" + x + "," + b + "]"
                                         : "[" + x + "," + y + "]";
      CHECK(records.items[k].find("s6:6672616d6573:" + frames + "}") != std::string::npos);
    }
  }
  const Read imp = ReadAs("rec_imp_p4.pickle", How::kRecords);
  // Less 1100 (an unknown key), 1104 (name and stage: not among these
  // keys) and 1106 (no list, dict or tuple in it).
  CHECK(imp.stats.records == 200 - 3);
  CHECK(!imp.as_record[1100]);
  CHECK(!imp.as_record[1104]);
  CHECK(!imp.as_record[1106]);
  CHECK(imp.as_record[1102]);
  CHECK(imp.as_record[1105]);
}

// The record templates (PickleReadOptions::fast_template): the same items,
// records, tree, errors and memo as FastPairs<true> alone (every test pickle
// read both ways, the reader's stats equal), and the entries they read.
TEST_CASE("pickle_reader: the record templates read exactly what records read without them") {
  const Fixture& f = Files();
  using Read = StreamedRead;
  auto read = [&](const std::string& name, bool records, bool templates, const std::string& list = "[0]") {
    PickleReadOptions o;
    o.fast_template = templates;
    return ReadStreamed(f / name, o, list, records ? &kTorchKeys : nullptr);
  };
  const auto same = [](const Read& a, const Read& b) {
    CHECK(a.error == b.error);
    CHECK(a.items == b.items);
    CHECK(a.as_record == b.as_record);
    CHECK(a.root == b.root);
    CHECK(a.stats.input_bytes == b.stats.input_bytes);
    CHECK(a.stats.peak_working_bytes == b.stats.peak_working_bytes);
    CHECK(a.stats.shared_containers == b.stats.shared_containers);
    CHECK(a.stats.fast_dicts == b.stats.fast_dicts);
    CHECK(a.stats.records == b.stats.records);
  };
  // The file made for them (see the generator): each entry's way, exactly.
  {
    const Read on = read("tmpl_p4.pickle", true, true), off = read("tmpl_p4.pickle", true, false);
    const Read general = read("tmpl_p4.pickle", false, false);
    REQUIRE(on.error.empty());
    same(on, off);
    CHECK(on.items == general.items);
    CHECK(on.items == Lines(ReadText(f / "tmpl.canon")));  // what Python reads
    REQUIRE(on.items.size() == 27);
    CHECK(on.stats.fast_dicts == 26);  // E1 to E26 (E0: the first batch)
    CHECK(on.stats.records == 24);
    CHECK(on.stats.template_records == 15);
    CHECK(off.stats.template_records == 0);
    for (std::size_t k = 0; k < 27; ++k) {
      INFO(k);
      CHECK(on.as_record[k] == (k != 0 && k != 12 && k != 13));
    }
    // E13: its addr key by the reference E12 put 'x' over (the memo changed: no template).
    CHECK(on.items[13].find("s1:78:i72192;") != std::string::npos);
    // E3, E4, E16, E20: frames of one item (APPEND) and none, read by a template.
    CHECK(on.items[4].find("s6:6672616d6573:[]") != std::string::npos);
    CHECK(on.items[20].find("s6:6672616d6573:[]") != std::string::npos);
  }
  // PyTorch's shape (torch_p4): allocs of nine keys, frees of six in turn;
  // every record after the first of each shape by a template (the other one
  // of the two after a change of shape), but those Python's framing put a
  // FRAME inside (the generator counts them).
  {
    const Read on = read("torch_p4.pickle", true, true), off = read("torch_p4.pickle", true, false);
    same(on, off);
    CHECK(on.stats.records == 40000 - 1000);
    const std::uint64_t expected = std::stoull(ReadText(f / "torch_template.txt"));
    CHECK(expected > 40000 - 1000 - 2 - 100);  // Python frames every 64 KiB: 42 FRAMEs in its 2.7 MB
    CHECK(on.stats.template_records == expected);
  }
  // Every other pickle: the same either way (with and without a streamed list).
  for (const char* name : {"fast_p2.pickle",     "fast_p4.pickle",     "fast_p5.pickle",     "fast_err_p2.pickle",
                           "fast_err_p4.pickle", "fast_err_p5.pickle", "fast_rec_p2.pickle", "fast_rec_p4.pickle",
                           "fast_rec_p5.pickle", "snap_p1.pickle",     "snap_p2.pickle",     "snap_p4.pickle",
                           "snap_p5.pickle",     "small_p2.pickle",    "small_p4.pickle",    "single_p2.pickle",
                           "single_p4.pickle",   "rec_imp_p2.pickle",  "rec_imp_p4.pickle",  "list_cache_p4.pickle"}) {
    INFO(name);
    for (const char* list : {"[0]", "[2]"}) {
      const Read on = read(name, true, true, list), off = read(name, true, false, list);
      same(on, off);
    }
  }
  // rec_imp: of its 197 records (1000 to 1199 less 1100, 1104 and 1106),
  // 1000 (the first) and 1102 (a segment_alloc of six keys) are read by
  // FastPairs; 1101 and 1103 to 1199 by the nine keys' template again (the
  // dicts 1100, 1104 and 1106 change no memo entry), 1103 after the six
  // keys' one failed.
  const Read rec = read("rec_imp_p4.pickle", true, true);
  CHECK(rec.stats.records == 200 - 3);
  CHECK(rec.stats.template_records == 197 - 2);
  // A POP that uncovers an entry read fast: the same error every way.
  {
    const std::string error = absl::StrCat("INVALID_ARGUMENT: pop_p4.pickle: offset ",
                                           ReadText(f / "pop_offset.txt"),
                                           ": POP that uncovers a dict in an item of a streamed list: not supported");
    const Read general = read("pop_p4.pickle", false, false);
    CHECK(general.error == error);
    CHECK(general.items.size() == 1);  // E0 (E1 and E2 wait in their batch)
    const Read on = read("pop_p4.pickle", true, true), off = read("pop_p4.pickle", true, false);
    same(on, off);
    CHECK(on.error == error);
    CHECK(on.items == general.items);
    PickleReadOptions o;  // the fast path without records
    o.stream_inside_items = false;
    o.stream_list = [](const PicklePath& path) { return path.size() == 2; };
    PickleReadStats stats;
    const absl::StatusOr<PickleDoc> fast = ReadFile(f / "pop_p4.pickle", o, &stats);
    CHECK(fast.status().ToString() == error);
    CHECK(stats.fast_dicts == 1);  // E1 (E2 is followed by the POP)
  }
  // Frames lists found by their first 16 bytes (see the generator): every
  // entry as Python reads it, the same with and without templates, every
  // record after the first by a template.
  {
    const Read on = read("prefix_p4.pickle", true, true, "[0]"), off = read("prefix_p4.pickle", true, false, "[0]");
    REQUIRE(on.error.empty());
    same(on, off);
    CHECK(on.items == Lines(ReadText(f / "prefix.canon")));
    CHECK(on.stats.records == 10);  // the second batch
    CHECK(on.stats.template_records == 9);
  }
  const Read lc = read("list_cache_p4.pickle", true, true);
  CHECK(lc.stats.records == 7);
  CHECK(lc.stats.template_records == 0);  // keys written out in every entry: no template
}

// FastDict reads a run of template records without going back to the opcode
// loop: it counts their opcodes and makes the working-memory checks as the
// loop would. With a budget that runs out in the middle of the trace
// entries, the read stops at the same opcode with the same error, the same
// items handed over and the same peak, with and without templates.
TEST_CASE("pickle_reader: a run of template records keeps the working-memory checks where they were") {
  const Fixture& f = Files();
  struct Read {
    std::size_t items = 0;
    std::string error;
    PickleReadStats stats;
  };
  const auto read = [&](bool templates, std::uint64_t fixed) {
    Read r;
    PickleReadOptions o;
    o.stream_inside_items = false;
    o.fast_template = templates;
    o.max_working_bytes_fixed = fixed;
    o.max_working_bytes_per_input_byte = 0;
    o.stream_list = [](const PicklePath& path) { return path.size() == 2 && path[1] == "[0]"; };
    o.on_item = [&](const PicklePath&, PyView) {
      ++r.items;
      return absl::OkStatus();
    };
    o.record_keys = kTorchKeys;
    o.on_record = [&](const PicklePath&, const PickleRecord&) {
      ++r.items;
      return absl::OkStatus();
    };
    absl::StatusOr<PickleDoc> v = ReadFile(f / "torch_p4.pickle", o, &r.stats);
    if (!v.ok()) r.error = v.status().ToString();
    return r;
  };
  const Read full = read(true, 1ull << 40);
  REQUIRE(full.error.empty());
  REQUIRE(full.items == 40000);
  CHECK(full.stats.template_records > 38000);
  CHECK(full.stats.peak_working_bytes == read(false, 1ull << 40).stats.peak_working_bytes);
  // Budgets from the peak down: those that stop the read among the entries.
  std::size_t among_entries = 0;
  for (std::uint64_t cut = 1; cut <= 64; ++cut) {
    const std::uint64_t fixed = full.stats.peak_working_bytes - cut * (full.stats.peak_working_bytes / 256);
    INFO("budget " << fixed);
    const Read on = read(true, fixed), off = read(false, fixed);
    REQUIRE(!on.error.empty());
    CHECK_THAT(on.error, Catch::Contains("bytes of working memory per byte of input"));
    CHECK(on.error == off.error);
    CHECK(on.items == off.items);
    CHECK(on.stats.input_bytes == off.stats.input_bytes);
    CHECK(on.stats.peak_working_bytes == off.stats.peak_working_bytes);
    CHECK(on.stats.records == off.stats.records);
    if (on.items > 1000 && on.items < 39000 && on.stats.template_records > 0) ++among_entries;
  }
  CHECK(among_entries > 0);
}

// The importer: the same requests, stacks, notes and segments with records,
// without them and without the fast path; exact values for records' and
// dicts' entries side by side.
std::string Digest(const std::vector<ImportedTrace>& traces) {
  std::string d;
  for (const ImportedTrace& t : traces) {
    absl::StrAppend(&d, "device ", t.device, " conf ", t.alloc_conf, " capacity ", t.device_capacity, " origin ",
                    t.requests.time_origin_us, "\n");
    for (const Request& r : t.requests.requests) {
      absl::StrAppend(&d, static_cast<int>(r.op), " ", r.slot, " ", r.size, " ", r.stream, " ", r.line, " ",
                      static_cast<int>(r.category), " ", static_cast<int>(r.phase), " ", r.step, " ", r.text, " ",
                      r.stack, " ", r.time_us, "\n");
    }
    for (std::uint32_t s = 0; s < t.requests.slot_count(); ++s) absl::StrAppend(&d, "id ", t.requests.IdOf(s), "\n");
    for (const std::string& s : t.requests.strings) absl::StrAppend(&d, "string ", s, "\n");
    for (const AllocStack& s : t.requests.stacks) {
      absl::StrAppend(&d, "stack ", s.site, "\n");
      for (const std::uint32_t id : s.frames) {
        const StackFrame& fr = t.requests.stack_frames[id];
        absl::StrAppend(&d, "  ", fr.filename, ":", fr.line, " ", fr.name, "\n");
      }
    }
    for (const PlannedAddress& a : t.requests.planned_mallocs)
      absl::StrAppend(&d, "malloc ", a.size, " ", a.addr, "\n");
    for (const auto& a : t.segment_actions)
      absl::StrAppend(&d, "segment ", static_cast<int>(a.type), " ", a.size, "\n");
    for (const std::string& n : t.notes) absl::StrAppend(&d, "note ", n, "\n");
  }
  return d;
}

TEST_CASE("snapshot import: records, dicts and the general path give the same trace") {
  const Fixture& f = Files();
  for (const char* name : {"rec_imp_p2.pickle", "rec_imp_p4.pickle", "torch_p4.pickle", "fast_p2.pickle",
                           "fast_p4.pickle", "fast_p5.pickle", "snap_p4.pickle"}) {
    INFO(name);
    const std::string path = (f.dir / name).string();
    const auto records = ReadPytorchSnapshot(path, {.records = true, .fast_dicts = true});
    const auto dicts = ReadPytorchSnapshot(path, {.records = false, .fast_dicts = true});
    const auto general = ReadPytorchSnapshot(path, {.records = false, .fast_dicts = false});
    REQUIRE(records.ok() == general.ok());
    REQUIRE(dicts.ok() == general.ok());
    if (!general.ok()) {
      CHECK(records.status() == general.status());
      continue;
    }
    CHECK(Digest(*records) == Digest(*general));
    CHECK(Digest(*dicts) == Digest(*general));
  }
  // Exact values on the file made for it: 1,198 allocs (1102 is a
  // segment_alloc, 1104 an annotation), the annotation a phase mark, the
  // unknown key of 1100 (read as a dict) named in a note.
  const auto t = ReadPytorchSnapshot((f.dir / "rec_imp_p4.pickle").string());
  REQUIRE(t.ok());
  REQUIRE(t->size() == 1);
  const ImportedTrace& d = (*t)[0];
  CHECK(d.requests.time_origin_us == 5000);
  REQUIRE(d.requests.requests.size() == 1199);
  std::size_t allocs = 0;
  for (const Request& r : d.requests.requests) allocs += r.op == RequestOp::kAlloc ? 1 : 0;
  CHECK(allocs == 1198);
  const Request& mark = d.requests.requests[1103];  // entry 1104 (1-based line 1105)
  CHECK(mark.op == RequestOp::kPhaseBegin);
  CHECK(mark.phase == Phase::kForward);
  CHECK(mark.step == 3);
  CHECK(mark.line == 1105);
  CHECK(mark.time_us == 6104);
  const Request& rec = d.requests.requests[1104];  // entry 1105: a record
  CHECK(rec.op == RequestOp::kAlloc);
  CHECK(rec.size == 1000 + 1105);
  CHECK(rec.time_us == 5000 + 1105);
  CHECK(rec.stack != 0);
  const Request& unknown = d.requests.requests[1100];  // entry 1100: a dict (the unknown key)
  CHECK(unknown.size == 1000 + 1100);
  CHECK(unknown.stack == d.requests.requests[1050].stack);  // the same frames list as 1050 (a record)
  CHECK(d.requests.requests[1106 - 1].stack == 0);          // entry 1106: no frames
  REQUIRE(d.segment_actions.size() == 1);
  CHECK(d.segment_actions[0].type == EventType::kSegmentAlloc);
  CHECK(d.segment_actions[0].size == 2u << 20);
  CHECK(d.requests.stacks.size() == 51);  // 50 distinct stacks and "none"
  bool named = false;
  for (const std::string& n : d.notes) named |= n == "trace entry fields memscope does not read: mystery (1)";
  CHECK(named);
}

namespace {

// A new directory of this test's own (the Python files are shared by every
// test process: a test writes its files here).
std::filesystem::path ScratchDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

void WriteFile(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// A read of the file at `path` through ReadPickleFile: the tree or the
// error, the file's path in it replaced by `source`.
std::string FileOutcome(const std::string& path, const std::string& source, const PickleReadOptions& o,
                        PickleReadStats* stats) {
  std::string r = Outcome(ReadPickleFile(path, o, stats));
  if (const std::size_t at = r.find(path); at != std::string::npos) r.replace(at, path.size(), source);
  return r;
}

// `bytes` (a pickle of protocol 2 or more) with no-op opcodes after its
// PROTO (NONE POP, BININT1 POP) making it `size` bytes long (size >=
// bytes.size() + 2): the same value.
std::string PadTo(const std::string& bytes, std::size_t size) {
  REQUIRE(bytes.size() >= 2);
  REQUIRE(static_cast<unsigned char>(bytes[0]) == 0x80);
  std::size_t pad = size - bytes.size();
  REQUIRE(pad >= 2);
  std::string nops;
  if (pad % 2 == 1) {
    nops += std::string("K\x01", 2) + "0";
    pad -= 3;
  }
  for (; pad > 0; pad -= 2) nops += "N0";
  return bytes.substr(0, 2) + nops + bytes.substr(2);
}

}  // namespace

// The input in memory (ReadPickleBytes) and a mapped file (ReadPickleFile)
// read what a stream reads: ReadBytes and ReadStreamed above compare every
// read they make; here every test pickle read whole.
TEST_CASE("pickle_reader: every test pickle reads the same in place, mapped and from a stream") {
  const Fixture& f = Files();
  // Every test pickle, read whole and with the lists at depth 2 streamed.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(f.dir)) {
    if (entry.path().extension() != ".pickle") continue;
    ++files;
    const std::string name = entry.path().filename().string();
    INFO(name);
    for (int streamed = 0; streamed < 2; ++streamed) {
      // (torch_p4 whole: the text of 40,000 entries and their frames, seconds; streamed only.)
      if (name == "torch_p4.pickle" && !streamed) continue;
      PickleReadOptions o;
      std::vector<std::string> items;
      if (streamed) {
        o.stream_list = [](const PicklePath& path) { return path.size() == 2; };
        o.on_item = [&](const PicklePath&, PyView item) {
          items.push_back(Canon(item));
          return absl::OkStatus();
        };
      }
      PickleReadStats s_stream, s_mapped, s_in_place;
      const std::string stream = Outcome(ReadFile(entry.path(), o, &s_stream));
      const std::vector<std::string> stream_items = std::exchange(items, {});
      const std::string mapped = FileOutcome(entry.path().string(), name, o, &s_mapped);
      CHECK(mapped == stream);
      CHECK(std::exchange(items, {}) == stream_items);
      CHECK(SameStats(s_mapped, s_stream));
      CHECK(s_mapped.mapped);
      CHECK(!s_stream.mapped);
      const Guarded g(ReadText(entry.path()));
      CHECK(Outcome(ReadPickleBytes(g.view(), name, o, &s_in_place)) == stream);
      CHECK(items == stream_items);
      CHECK(SameStats(s_in_place, s_stream));
    }
  }
  CHECK(files >= 39);
}

// Mapped files read what a stream reads at their edges: truncated, ending at
// a page boundary, large enough to release pages behind the read; and the
// files that are not mapped.
TEST_CASE("pickle_reader: truncated, page-aligned and large mapped files, and unmapped ones, read as a stream does") {
  const Fixture& f = Files();
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::filesystem::path dir = ScratchDir("memscope-mapped");
  // Truncated files: the same one-line error, mapped or not, at every length.
  const std::string small = ReadText(f / "small_p4.pickle");
  for (std::size_t n = 0; n < small.size(); ++n) {
    INFO("truncated to " << n);
    const std::string path = (dir / "cut.pickle").string();
    WriteFile(path, std::string_view(small).substr(0, n));
    PickleReadStats stats;
    const std::string mapped = FileOutcome(path, "mem.pickle", {}, &stats);
    CHECK(mapped == Outcome(ReadBytes(small.substr(0, n))));
    CHECK(mapped.find("INVALID_ARGUMENT: mem.pickle: offset ") == 0);
    CHECK(mapped.find('\n') == std::string::npos);
    CHECK(stats.mapped == (n > 0));  // an empty file is read as a stream
  }
  // Trace files ending at a page boundary (the fast paths and templates
  // read up to the very end) and one byte short of it: the same items and
  // records as the file unpadded, in place (before a guard page) and
  // mapped.
  for (const char* name : {"torch_p4.pickle", "fast_p4.pickle", "fast_p5.pickle", "rec_imp_p4.pickle"}) {
    const std::string bytes = ReadText(f / name);
    const StreamedRead plain = ReadStreamedFrom(Input::kStream, f / name, {}, "[0]", &kTorchKeys);
    REQUIRE(plain.error.empty());
    for (std::size_t less : {0, 1}) {
      INFO(name << " ending " << less << " byte(s) before a page boundary");
      const std::size_t size = (bytes.size() + 2 + less + page - 1) / page * page - less;
      const std::filesystem::path path = dir / name;
      WriteFile(path, PadTo(bytes, size));
      REQUIRE(std::filesystem::file_size(path) == size);
      for (Input input : {Input::kInPlace, Input::kMapped}) {
        const StreamedRead padded = ReadStreamedFrom(input, path, {}, "[0]", &kTorchKeys);
        CHECK(padded.error.empty());
        CHECK(padded.items == plain.items);
        CHECK(padded.as_record == plain.as_record);
        CHECK(padded.root == plain.root);
        CHECK(padded.stats.records == plain.stats.records);
        CHECK(padded.stats.template_records == plain.stats.template_records);
      }
    }
  }
  // A 16 MiB file: the pages read are released behind the read, all but the
  // last 4 to 8 MiB (and the page being read); the value is the same.
  {
    std::string big = "\x80\x04";
    const std::string item = "\x8c\xff" + std::string(255, 'a') + "0";  // a str, POP
    while (big.size() < (16u << 20)) big += item;
    big += "N.";
    const std::string path = (dir / "big.pickle").string();
    WriteFile(path, big);
    PickleReadStats stats;
    const std::string mapped = FileOutcome(path, "mem.pickle", {}, &stats);
    CHECK(mapped == "ok N");
    CHECK(stats.mapped);
    CHECK(stats.released_bytes % page == 0);
    CHECK(stats.released_bytes + (8u << 20) + page >= big.size());
    CHECK(stats.released_bytes + (4u << 20) <= big.size());
    PickleReadStats streamed;
    CHECK(Outcome(ReadBytes(big, {}, &streamed)) == mapped);
    CHECK(SameStats(stats, streamed));
    CHECK(streamed.released_bytes == 0);
  }
  // Not mapped: an empty file, a FIFO (read as a stream, opened once), a
  // directory; a missing file cannot be opened.
  {
    const std::string empty = (dir / "empty.pickle").string();
    WriteFile(empty, "");
    PickleReadStats stats;
    CHECK(FileOutcome(empty, "mem.pickle", {}, &stats) ==
          "INVALID_ARGUMENT: mem.pickle: offset 0: empty input: not a pickle");
    CHECK(!stats.mapped);

    const std::string fifo = (dir / "fifo.pickle").string();
    std::filesystem::remove(fifo);
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    std::thread writer([&] { WriteFile(fifo, small); });
    stats = {};
    const std::string read = FileOutcome(fifo, "mem.pickle", {}, &stats);
    writer.join();
    CHECK(read == Outcome(ReadBytes(small)));
    CHECK(read.rfind("ok ", 0) == 0);
    CHECK(!stats.mapped);

    stats = {};
    CHECK(FileOutcome(dir.string(), "mem.pickle", {}, &stats) ==
          "INVALID_ARGUMENT: mem.pickle: offset 0: empty input: not a pickle");
    CHECK(!stats.mapped);

    const std::string missing = (dir / "missing.pickle").string();
    const absl::StatusOr<PickleDoc> v = ReadPickleFile(missing);
    CHECK(v.status().code() == absl::StatusCode::kNotFound);
    CHECK(v.status().message() == "cannot open '" + missing + "'");
  }
  std::filesystem::remove_all(dir);
}

// The snapshot importer reads a file it cannot map (a FIFO) as a stream:
// the same trace as the file's.
TEST_CASE("snapshot import: a FIFO reads as the file") {
  const Fixture& f = Files();
  const std::filesystem::path dir = ScratchDir("memscope-fifo");
  const std::string fifo = (dir / "snap.pickle").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const std::string bytes = ReadText(f / "rec_imp_p4.pickle");
  std::thread writer([&] { WriteFile(fifo, bytes); });
  const auto piped = ReadPytorchSnapshot(fifo);
  writer.join();
  const auto file = ReadPytorchSnapshot((f / "rec_imp_p4.pickle").string());
  REQUIRE(file.ok());
  REQUIRE(piped.ok());
  CHECK(Digest(*piped) == Digest(*file));
  CHECK((*file)[0].requests.requests.size() == 1199);
  std::filesystem::remove_all(dir);
}
