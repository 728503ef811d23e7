#include "powerloss/crash_model.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

namespace cairn::powerloss {
namespace {

constexpr uint64_t kSector = 512;
constexpr int kKeepSize = 0x01;   // FALLOC_FL_KEEP_SIZE
constexpr int kPunchHole = 0x02;  // FALLOC_FL_PUNCH_HOLE
constexpr int kZeroRange = 0x10;  // FALLOC_FL_ZERO_RANGE

[[noreturn]] void malformed(size_t line, std::string_view why) {
  throw std::runtime_error(fmt::format("trace line {}: {}", line, why));
}

std::string unescape(std::string_view s, size_t line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) malformed(line, "bad escape");
    unsigned v = 0;
    auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc() || p != s.data() + i + 3) malformed(line, "bad escape");
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i <= line.size()) {
    size_t j = line.find(' ', i);
    if (j == std::string_view::npos) j = line.size();
    out.push_back(line.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

uint64_t number(std::string_view s, size_t line, int base = 10) {
  uint64_t v = 0;
  int64_t sv = 0;
  if (!s.empty() && s[0] == '-') {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), sv, base);
    if (ec != std::errc() || p != s.data() + s.size()) malformed(line, "bad number");
    return static_cast<uint64_t>(sv);
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size()) malformed(line, "bad number");
  return v;
}

std::string parent_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

bool is_dir_op(OpKind k) {
  return k == OpKind::kCreate || k == OpKind::kMkdir || k == OpKind::kRmdir ||
         k == OpKind::kUnlink || k == OpKind::kRename || k == OpKind::kLink;
}

bool is_file_op(OpKind k) {
  return k == OpKind::kWrite || k == OpKind::kTruncate || k == OpKind::kFallocate;
}

bool is_barrier(OpKind k) {
  return k == OpKind::kFsync || k == OpKind::kFsyncDir || k == OpKind::kSync;
}

bool below(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

void put(std::string& content, uint64_t offset, std::string_view bytes) {
  if (content.size() < offset + bytes.size()) content.resize(offset + bytes.size(), '\0');
  std::copy(bytes.begin(), bytes.end(), content.begin() + static_cast<ptrdiff_t>(offset));
}

void apply_file_op(std::string& content, const Op& op, int fate, const std::vector<bool>* torn) {
  switch (op.kind) {
    case OpKind::kWrite:
      if (fate == 2 && torn) {
        // Sector pieces aligned to the file offset.
        uint64_t pos = op.offset;
        size_t piece = 0;
        while (pos < op.offset + op.length) {
          const uint64_t end = std::min(op.offset + op.length, (pos / kSector + 1) * kSector);
          if (piece < torn->size() && (*torn)[piece]) {
            put(content, pos,
                std::string_view(op.data).substr(static_cast<size_t>(pos - op.offset),
                                                 static_cast<size_t>(end - pos)));
          }
          pos = end;
          ++piece;
        }
      } else {
        put(content, op.offset, op.data);
      }
      break;
    case OpKind::kTruncate:
      content.resize(static_cast<size_t>(op.length), '\0');
      break;
    case OpKind::kFallocate: {
      const uint64_t end = op.offset + op.length;
      if (op.mode & (kPunchHole | kZeroRange)) {
        const uint64_t stop = std::min<uint64_t>(end, content.size());
        for (uint64_t i = op.offset; i < stop; ++i) content[i] = '\0';
      }
      if (!(op.mode & kKeepSize) && content.size() < end) content.resize(end, '\0');
      break;
    }
    default:
      break;
  }
}

size_t sectors_of(const Op& op) {
  if (op.length == 0) return 0;
  return static_cast<size_t>((op.offset + op.length - 1) / kSector - op.offset / kSector + 1);
}

}  // namespace

uint64_t initial_inode(const Image& initial, const std::string& path) {
  auto it = initial.files.find(path);
  if (it == initial.files.end()) return 0;
  return static_cast<uint64_t>(std::distance(initial.files.begin(), it)) + 1;
}

std::string describe(const Op& op) {
  switch (op.kind) {
    case OpKind::kCreate:
      return fmt::format("create {} (inode {})", op.path, op.inode);
    case OpKind::kMkdir:
      return fmt::format("mkdir {}", op.path);
    case OpKind::kRmdir:
      return fmt::format("rmdir {}", op.path);
    case OpKind::kUnlink:
      return fmt::format("unlink {}", op.path);
    case OpKind::kRename:
      return fmt::format("rename {} {}", op.path, op.path2);
    case OpKind::kLink:
      return fmt::format("link {} {}", op.path, op.path2);
    case OpKind::kWrite:
      return fmt::format("write inode {} [{}, +{})", op.inode, op.offset, op.length);
    case OpKind::kTruncate:
      return fmt::format("truncate inode {} to {}", op.inode, op.length);
    case OpKind::kFallocate:
      return fmt::format("fallocate inode {} mode {} [{}, +{})", op.inode, op.mode, op.offset,
                         op.length);
    case OpKind::kFsync:
      return fmt::format("fsync inode {}", op.inode);
    case OpKind::kFsyncDir:
      return fmt::format("fsync dir '{}'", op.path);
    case OpKind::kSync:
      return "sync";
    case OpKind::kMark:
      return fmt::format("mark {}", op.path);
  }
  return "?";
}

Trace parse_trace(std::string_view text, const Image& initial) {
  Trace out;
  std::map<std::string, uint64_t> names;  // the issued namespace: path -> model inode
  for (const auto& [path, content] : initial.files) names[path] = initial_inode(initial, path);
  uint64_t next_inode = initial.files.size() + 1;
  std::map<uint64_t, uint64_t> bound;  // recorded st_ino -> model inode
  auto model_inode = [&](std::string_view recorded, size_t line) {
    auto it = bound.find(number(recorded, line));
    if (it == bound.end()) malformed(line, "an inode that was never opened");
    return it->second;
  };
  size_t pos = 0;
  size_t line_no = 0;
  while (pos < text.size()) {
    ++line_no;
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) malformed(line_no, "no end of line");
    const auto f = fields(text.substr(pos, nl - pos));
    pos = nl + 1;
    const std::string_view kind = f[0];
    auto need = [&](size_t n) {
      if (f.size() != n) malformed(line_no, fmt::format("{} wants {} fields", kind, n - 1));
    };
    Op op{};
    if (kind == "create") {
      need(3);
      op.kind = OpKind::kCreate;
      op.path = unescape(f[2], line_no);
      op.inode = next_inode++;
      bound[number(f[1], line_no)] = op.inode;
      names[op.path] = op.inode;
    } else if (kind == "open") {
      need(4);
      const std::string path = unescape(f[3], line_no);
      auto it = names.find(path);
      if (it == names.end()) malformed(line_no, "open of a file that does not exist: " + path);
      bound[number(f[1], line_no)] = it->second;
      if (number(f[2], line_no, 16) & 040000) ++out.direct_opens;  // O_DIRECT on x86-64
      continue;
    } else if (kind == "mkdir" || kind == "rmdir" || kind == "unlink") {
      need(2);
      op.kind = kind == "mkdir"   ? OpKind::kMkdir
                : kind == "rmdir" ? OpKind::kRmdir
                                  : OpKind::kUnlink;
      op.path = unescape(f[1], line_no);
      if (op.kind == OpKind::kUnlink) names.erase(op.path);
      if (op.kind == OpKind::kRmdir) {
        for (auto it = names.begin(); it != names.end();) {
          it = below(it->first, op.path) ? names.erase(it) : std::next(it);
        }
      }
    } else if (kind == "rename" || kind == "link") {
      need(3);
      op.kind = kind == "rename" ? OpKind::kRename : OpKind::kLink;
      op.path = unescape(f[1], line_no);
      op.path2 = unescape(f[2], line_no);
      auto it = names.find(op.path);
      if (it == names.end()) malformed(line_no, "only files are renamed or linked: " + op.path);
      names[op.path2] = it->second;
      if (op.kind == OpKind::kRename) names.erase(op.path);
    } else if (kind == "write") {
      need(4);
      op.kind = OpKind::kWrite;
      op.inode = model_inode(f[1], line_no);
      op.offset = number(f[2], line_no);
      op.length = number(f[3], line_no);
      if (pos + op.length + 1 > text.size() || text[pos + op.length] != '\n') {
        malformed(line_no, "written bytes cut short");
      }
      op.data = std::string(text.substr(pos, op.length));
      pos += op.length + 1;
    } else if (kind == "trunc") {
      need(3);
      op.kind = OpKind::kTruncate;
      op.inode = model_inode(f[1], line_no);
      op.length = number(f[2], line_no);
    } else if (kind == "falloc") {
      need(5);
      op.kind = OpKind::kFallocate;
      op.inode = model_inode(f[1], line_no);
      op.mode = static_cast<int>(number(f[2], line_no));
      op.offset = number(f[3], line_no);
      op.length = number(f[4], line_no);
    } else if (kind == "fsync" || kind == "fdatasync") {
      need(2);
      op.kind = OpKind::kFsync;
      op.inode = model_inode(f[1], line_no);
    } else if (kind == "fsyncdir") {
      need(2);
      op.kind = OpKind::kFsyncDir;
      op.path = unescape(f[1], line_no);
    } else if (kind == "sync") {
      need(1);
      op.kind = OpKind::kSync;
    } else if (kind == "mark") {
      need(2);
      op.kind = OpKind::kMark;
      op.path = unescape(f[1], line_no);
    } else {
      malformed(line_no, fmt::format("unknown record '{}'", kind));
    }
    out.ops.push_back(std::move(op));
  }
  return out;
}

CrashStates::CrashStates(const Trace& trace, Image initial, Model model)
    : trace_(trace), initial_(std::move(initial)), model_(model) {
  initial_.dirs.insert("");
  for (size_t i = 0; i < trace_.ops.size(); ++i) {
    if (is_barrier(trace_.ops[i].kind)) points_.push_back(i);
  }
  points_.push_back(trace_.ops.size());
}

std::string CrashStates::group_of(const Op& op) const {
  if (model_ == Model::kExt4Ordered) return "";
  return parent_of(op.kind == OpKind::kRename || op.kind == OpKind::kLink ? op.path2 : op.path);
}

CrashStates::Durability CrashStates::durability(size_t crash_point) const {
  Durability d;
  // Walking back from the crash point: which inodes and groups have a
  // barrier after the operation at hand.
  std::set<uint64_t> synced_inodes;
  std::set<std::string> synced_groups;
  bool all_synced = false;
  for (size_t i = crash_point; i-- > 0;) {
    const Op& op = trace_.ops[i];
    switch (op.kind) {
      case OpKind::kSync:
        all_synced = true;
        break;
      case OpKind::kFsync:
        synced_inodes.insert(op.inode);
        break;
      case OpKind::kFsyncDir:
        synced_groups.insert(model_ == Model::kExt4Ordered ? "" : op.path);
        break;
      default:
        if (is_dir_op(op.kind)) {
          const std::string g = group_of(op);
          ++d.total[g];
          if (all_synced || synced_groups.count(g)) ++d.durable[g];
        } else if (is_file_op(op.kind)) {
          if (!all_synced && !synced_inodes.count(op.inode)) d.unsynced_file_ops.push_back(i);
        }
    }
  }
  std::reverse(d.unsynced_file_ops.begin(), d.unsynced_file_ops.end());
  return d;
}

Image CrashStates::build(const Choice& choice) const {
  std::map<std::string, uint64_t> names;
  std::map<uint64_t, std::string> content;
  std::set<std::string> dirs = initial_.dirs;
  for (const auto& [path, bytes] : initial_.files) {
    const uint64_t ino = initial_inode(initial_, path);
    names[path] = ino;
    content[ino] = bytes;
  }
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < choice.crash_point && i < trace_.ops.size(); ++i) {
    const Op& op = trace_.ops[i];
    if (is_dir_op(op.kind)) {
      const std::string g = group_of(op);
      const size_t idx = seen[g]++;
      auto p = choice.prefix.find(g);
      if (p != choice.prefix.end() && idx >= p->second) continue;
      switch (op.kind) {
        case OpKind::kCreate:
          if (dirs.count(parent_of(op.path))) names[op.path] = op.inode;
          break;
        case OpKind::kMkdir:
          if (dirs.count(parent_of(op.path))) dirs.insert(op.path);
          break;
        case OpKind::kRmdir:
          dirs.erase(op.path);
          for (auto it = dirs.begin(); it != dirs.end();) {
            it = below(*it, op.path) ? dirs.erase(it) : std::next(it);
          }
          for (auto it = names.begin(); it != names.end();) {
            it = below(it->first, op.path) ? names.erase(it) : std::next(it);
          }
          break;
        case OpKind::kUnlink:
          names.erase(op.path);
          break;
        case OpKind::kRename:
        case OpKind::kLink: {
          auto it = names.find(op.path);
          if (it == names.end() || !dirs.count(parent_of(op.path2))) break;
          const uint64_t ino = it->second;
          if (op.kind == OpKind::kRename) names.erase(it);
          names[op.path2] = ino;
          break;
        }
        default:
          break;
      }
    } else if (is_file_op(op.kind)) {
      auto f = choice.fate.find(i);
      const int fate = f == choice.fate.end() ? 1 : f->second;
      if (fate == 0) continue;
      auto t = choice.torn.find(i);
      apply_file_op(content[op.inode], op, fate, t == choice.torn.end() ? nullptr : &t->second);
    }
  }
  Image out;
  out.dirs = dirs;
  for (const auto& [path, ino] : names) {
    if (dirs.count(parent_of(path))) out.files[path] = content[ino];
  }
  return out;
}

Image CrashStates::issued(size_t crash_point) const {
  Choice all;
  all.crash_point = crash_point;
  return build(all);
}

std::vector<CrashState> CrashStates::states_at(size_t crash_point, int samples,
                                               std::mt19937_64& rng) const {
  std::vector<CrashState> out;
  const Durability d = durability(crash_point);
  auto add = [&](Choice c) {
    Image image = build(c);
    out.push_back({std::move(c), std::move(image)});
  };
  auto all_lost = [&](Choice& c, const Durability& dur) {
    for (size_t i : dur.unsynced_file_ops) c.fate[i] = 0;
  };
  // The least that may survive.
  {
    Choice c;
    c.crash_point = crash_point;
    c.prefix = d.durable;
    for (const auto& [g, n] : d.total) c.prefix.emplace(g, 0);
    all_lost(c, d);
    add(std::move(c));
  }
  // Everything issued.
  {
    Choice c;
    c.crash_point = crash_point;
    add(std::move(c));
  }
  // Each length of each group's unsynced tail, the file ops kept or lost.
  for (const auto& [g, total] : d.total) {
    const auto dn = d.durable.find(g);
    const size_t durable = dn == d.durable.end() ? 0 : dn->second;
    for (size_t len = durable; len < total; ++len) {
      for (int lose = 0; lose < 2; ++lose) {
        Choice c;
        c.crash_point = crash_point;
        c.prefix[g] = len;
        if (lose) all_lost(c, d);
        add(std::move(c));
      }
    }
  }
  // Random choices, each at a random cut since the previous crash point.
  auto it = std::lower_bound(points_.begin(), points_.end(), crash_point);
  const size_t previous = it == points_.begin() ? 0 : *std::prev(it);
  for (int s = 0; s < samples; ++s) {
    Choice c;
    c.crash_point = previous + static_cast<size_t>(rng() % (crash_point - previous + 1));
    const Durability dc = c.crash_point == crash_point ? d : durability(c.crash_point);
    for (const auto& [g, total] : dc.total) {
      const auto dn = dc.durable.find(g);
      const size_t durable = dn == dc.durable.end() ? 0 : dn->second;
      c.prefix[g] = durable + static_cast<size_t>(rng() % (total - durable + 1));
    }
    for (size_t i : dc.unsynced_file_ops) {
      const Op& op = trace_.ops[i];
      const size_t sectors = op.kind == OpKind::kWrite ? sectors_of(op) : 0;
      const int fate = static_cast<int>(rng() % (sectors > 1 ? 3 : 2));
      c.fate[i] = fate;
      if (fate == 2) {
        std::vector<bool> mask(sectors);
        for (size_t k = 0; k < sectors; ++k) mask[k] = (rng() & 1) != 0;
        c.torn[i] = std::move(mask);
      }
    }
    add(std::move(c));
  }
  return out;
}

std::string CrashStates::describe(const Choice& choice) const {
  std::string s =
      fmt::format("crash before operation {} of {}", choice.crash_point, trace_.ops.size());
  const size_t from = choice.crash_point > 6 ? choice.crash_point - 6 : 0;
  for (size_t i = from; i < choice.crash_point; ++i) {
    s += fmt::format("\n  #{} {}", i, cairn::powerloss::describe(trace_.ops[i]));
  }
  for (const auto& [g, n] : choice.prefix)
    s += fmt::format("\n  group '{}': {} dir ops survive", g, n);
  for (const auto& [i, fate] : choice.fate) {
    if (fate != 1) {
      s += fmt::format("\n  {} #{} {}", fate == 0 ? "lost" : "torn", i,
                       cairn::powerloss::describe(trace_.ops[i]));
    }
  }
  return s;
}

}  // namespace cairn::powerloss
