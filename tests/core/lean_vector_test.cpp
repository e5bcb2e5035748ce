// detail::lean_vector, the runtime's bookkeeping vector: the same contents as std::vector after
// every operation of a random sequence, for trivially copyable and for owning element types (and,
// under AddressSanitizer, the storage past the end poisoned after each); every element constructed
// is destroyed once; a throwing copy leaves the vector as it was, and a throwing copy constructor
// destroys what it built; arguments that refer into the vector survive its growth; at() names the
// index and the size; sizes that overflow throw length_error; under PIPESWAP_ASSERTIONS an index past
// the end aborts with a message, and under ASan reading past the end is a container-overflow.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <pipeswap/core/detail/lean_vector.hpp>

namespace ps = pipeswap;
using ps::detail::lean_vector;

namespace {

struct pod {
  std::uint32_t a = 0;
  double b = 0;
  friend bool operator==(pod const&, pod const&) = default;
};

/// Counts live instances; the copy constructor throws once `copies_left` reaches 0.
struct counted {
  static inline long live = 0;
  static inline long copies_left = -1; // < 0: never throw
  int v = 0;
  counted() noexcept { ++live; }
  explicit counted(int x) noexcept : v(x) { ++live; }
  counted(counted const& o) : v(o.v) {
    if (copies_left == 0) throw std::runtime_error("counted: copy refused");
    if (copies_left > 0) --copies_left;
    ++live;
  }
  counted(counted&& o) noexcept : v(o.v) { ++live; }
  counted& operator=(counted const& o) = default;
  counted& operator=(counted&& o) noexcept = default;
  ~counted() { --live; }
  friend bool operator==(counted const& a, counted const& b) { return a.v == b.v; }
};

template <class T>
T make(int x) {
  if constexpr (std::is_same_v<T, pod>)
    return pod{static_cast<std::uint32_t>(x), x * 0.5};
  else if constexpr (std::is_same_v<T, std::string>)
    return std::string(static_cast<std::size_t>(x % 40), static_cast<char>('a' + x % 26));
  else if constexpr (std::is_same_v<T, counted>)
    return counted(x);
  else if constexpr (std::is_same_v<T, std::shared_ptr<int>>)
    return std::make_shared<int>(x);
  else
    return static_cast<T>(x);
}

/// Equal elements; shared pointers compare what they point to (the two containers get distinct
/// but equal objects).
template <class T>
bool equal(T const& x, T const& y) {
  if constexpr (std::is_same_v<T, std::shared_ptr<int>>)
    return x && y ? *x == *y : !x && !y;
  else
    return x == y;
}

/// Under ASan: the bytes [0, size) of the buffer are addressable and [size, capacity) poisoned.
template <class T>
bool annotated(lean_vector<T> const& a) {
#if PIPESWAP_DETAIL_ASAN
  if (a.capacity() == 0) return true;
  auto const* beg = reinterpret_cast<char const*>(a.data());
  return __sanitizer_verify_contiguous_container(beg, beg + a.size() * sizeof(T), beg + a.capacity() * sizeof(T)) != 0;
#else
  (void)a;
  return true;
#endif
}

template <class T>
bool same(lean_vector<T> const& a, std::vector<T> const& b) {
  if (a.size() != b.size() || a.empty() != b.empty() || a.capacity() < a.size()) return false;
  if (!annotated(a)) return false;
  if (static_cast<std::size_t>(a.end() - a.begin()) != a.size()) return false;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (!equal(a[i], b[i])) return false;
  }
  return true;
}

/// 4000 random operations, applied to both containers, compared after each.
template <class T>
void differential(unsigned seed) {
  std::mt19937 rng(seed);
  lean_vector<T> a;
  std::vector<T> b;
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % (n == 0 ? 1 : n)); };
  for (int step = 0; step < 4000; ++step) {
    int const x = static_cast<int>(rng() % 1000);
    auto const op = rng() % 13;
    switch (op) {
    case 0:
    case 1:
      a.push_back(make<T>(x));
      b.push_back(make<T>(x));
      break;
    case 2:
      a.emplace_back(make<T>(x));
      b.emplace_back(make<T>(x));
      break;
    case 3:
      if (!b.empty()) {
        a.pop_back();
        b.pop_back();
      }
      break;
    case 4: {
      auto const i = pick(b.size() + 1);
      auto ra = a.insert(a.begin() + i, make<T>(x));
      auto rb = b.insert(b.begin() + static_cast<std::ptrdiff_t>(i), make<T>(x));
      BOOST_TEST(static_cast<std::size_t>(ra - a.begin()) == static_cast<std::size_t>(rb - b.begin()));
      break;
    }
    case 5: {
      if (b.empty()) break;
      auto const i = pick(b.size());
      auto const j = i + pick(b.size() - i + 1);
      auto ra = a.erase(a.begin() + i, a.begin() + j);
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(i), b.begin() + static_cast<std::ptrdiff_t>(j));
      BOOST_TEST(static_cast<std::size_t>(ra - a.begin()) == i);
      break;
    }
    case 6: {
      if (b.empty()) break;
      auto const i = pick(b.size());
      a.erase(a.begin() + i);
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    case 7: {
      auto const n = pick(70);
      a.resize(n);
      b.resize(n);
      break;
    }
    case 8: {
      auto const n = pick(70);
      a.resize(n, make<T>(x));
      b.resize(n, make<T>(x));
      break;
    }
    case 9: {
      auto const n = pick(20);
      a.assign(n, make<T>(x));
      b.assign(n, make<T>(x));
      break;
    }
    case 10: {
      lean_vector<T> c(a); // copy, then move back
      BOOST_TEST(same(c, b));
      a = std::move(c);
      BOOST_TEST(c.empty());
      break;
    }
    case 11: {
      lean_vector<T> c;
      c.push_back(make<T>(x));
      c = a; // copy assignment over contents
      a = c;
      break;
    }
    default:
      if (rng() % 8 == 0) {
        a.clear();
        b.clear();
      } else {
        a.reserve(pick(100));
      }
      break;
    }
    BOOST_TEST_REQUIRE(same(a, b), "lean_vector and std::vector differ after step "
                                       << step << " (operation " << op << ", sizes " << a.size() << " and " << b.size()
                                       << ")");
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(core_lean_vector)

BOOST_AUTO_TEST_CASE(matches_std_vector_over_random_operations) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    differential<std::size_t>(seed);
    differential<pod>(seed);
    differential<std::string>(seed);
    differential<std::shared_ptr<int>>(seed);
    differential<counted>(seed);
  }
  BOOST_TEST(counted::live == 0);
}

BOOST_AUTO_TEST_CASE(every_element_is_destroyed_once) {
  {
    lean_vector<counted> v;
    for (int i = 0; i < 100; ++i) v.emplace_back(i);
    BOOST_TEST(counted::live == 100);
    v.erase(v.begin() + 10, v.begin() + 30);
    BOOST_TEST(counted::live == 80);
    v.resize(5);
    BOOST_TEST(counted::live == 5);
    lean_vector<counted> w(v);
    BOOST_TEST(counted::live == 10);
    w = std::move(v);
    BOOST_TEST(counted::live == 5);
  }
  BOOST_TEST(counted::live == 0);
  std::weak_ptr<int> watch;
  {
    lean_vector<std::shared_ptr<int>> v;
    v.push_back(std::make_shared<int>(7));
    watch = v.front();
    for (int i = 0; i < 50; ++i) v.push_back(v.front()); // grows past several capacities
    BOOST_TEST(watch.use_count() == 51);
  }
  BOOST_TEST(watch.expired());
}

// A copy that throws while the vector grows, resizes or inserts leaves it as it was.
BOOST_AUTO_TEST_CASE(a_throwing_copy_changes_nothing) {
  lean_vector<counted> v;
  for (int i = 0; i < 8; ++i) v.emplace_back(i);
  v.reserve(8);
  BOOST_TEST(v.capacity() == 8u);
  counted const extra(99);
  counted::copies_left = 0;
  BOOST_CHECK_THROW(v.push_back(extra), std::runtime_error); // at capacity: would grow
  BOOST_TEST(v.size() == 8u);
  BOOST_TEST(v.capacity() == 8u);
  counted::copies_left = 3;
  BOOST_CHECK_THROW(v.resize(20, extra), std::runtime_error); // the value's copy and 2 of 12 new ones
  BOOST_TEST(v.size() == 8u);
  counted::copies_left = 0;
  BOOST_CHECK_THROW(v.insert(v.begin(), extra), std::runtime_error);
  counted::copies_left = -1;
  BOOST_TEST_REQUIRE(v.size() == 8u);
  for (int i = 0; i < 8; ++i) BOOST_TEST(v[static_cast<std::size_t>(i)].v == i);
  BOOST_TEST(counted::live == 9); // v's 8 and `extra`
}

// push_back, insert and resize take their argument by reference: one that lives in the vector
// must still be read correctly when the vector reallocates.
BOOST_AUTO_TEST_CASE(arguments_from_inside_survive_growth) {
  lean_vector<std::size_t> t{1, 2, 3};
  t.reserve(3);
  t.push_back(t[0]);
  t.insert(t.begin(), t.back());
  t.resize(t.capacity() + 1, t[2]);
  std::vector<std::size_t> want{1, 1, 2, 3, 1};
  want.resize(t.size(), 2);
  BOOST_TEST(std::vector<std::size_t>(t.begin(), t.end()) == want, boost::test_tools::per_element());

  lean_vector<std::string> s;
  s.push_back(std::string(100, 'x'));
  s.reserve(1);
  s.push_back(s[0]);
  s.insert(s.begin(), s.back());
  BOOST_TEST(s.size() == 3u);
  for (auto const& e : s) BOOST_TEST(e == std::string(100, 'x'));
}

// resize_for_overwrite keeps the elements below the old size, grows the capacity when it must, and
// shrinks without touching what stays.
BOOST_AUTO_TEST_CASE(resize_for_overwrite_keeps_the_prefix) {
  lean_vector<std::size_t> v{7, 8, 9};
  v.resize_for_overwrite(100);
  BOOST_TEST_REQUIRE(v.size() == 100u);
  BOOST_TEST(v.capacity() >= 100u);
  BOOST_TEST(v[0] == 7u);
  BOOST_TEST(v[1] == 8u);
  BOOST_TEST(v[2] == 9u);
  for (std::size_t i = 3; i < 100; ++i) v[i] = i;
  v.resize_for_overwrite(4);
  std::vector<std::size_t> want{7, 8, 9, 3};
  BOOST_TEST(std::vector<std::size_t>(v.begin(), v.end()) == want, boost::test_tools::per_element());
  v.resize_for_overwrite(0);
  BOOST_TEST(v.empty());
}

BOOST_AUTO_TEST_CASE(at_names_the_index_and_the_size) {
  lean_vector<pod> v(3);
  BOOST_TEST(v.at(2).a == 0u);
  try {
    (void)v.at(3);
    BOOST_FAIL("at(3) of a 3-element vector did not throw");
  } catch (std::out_of_range const& e) {
    BOOST_TEST(std::string(e.what()) == "lean_vector::at: index 3 is not below the size 3");
  }
}

// A copy constructor that throws part-way destroys the elements it had copied.
BOOST_AUTO_TEST_CASE(a_throwing_copy_constructor_destroys_what_it_built) {
  lean_vector<counted> v;
  for (int i = 0; i < 10; ++i) v.emplace_back(i);
  counted::copies_left = 4; // the fifth copy throws
  BOOST_CHECK_THROW(lean_vector<counted>{v}, std::runtime_error);
  BOOST_TEST(counted::live == 10);
  counted::copies_left = 2;
  BOOST_CHECK_THROW((lean_vector<counted>(v.begin(), v.end())), std::runtime_error);
  BOOST_TEST(counted::live == 10);
  counted::copies_left = 1;
  BOOST_CHECK_THROW((lean_vector<counted>{counted(1), counted(2), counted(3)}), std::runtime_error);
  BOOST_TEST(counted::live == 10);
  counted::copies_left = -1;
}

BOOST_AUTO_TEST_CASE(sizes_that_overflow_throw_length_error) {
  lean_vector<pod> v;
  BOOST_CHECK_THROW(v.reserve(~std::size_t{0} / 4), std::length_error);
  BOOST_CHECK_THROW(v.resize(~std::size_t{0} / 2), std::length_error);
  lean_vector<std::string> s;
  BOOST_CHECK_THROW(s.reserve(~std::size_t{0} / 8), std::length_error);
  BOOST_TEST(v.empty());
  BOOST_TEST(s.empty());
}

namespace {

/// Runs `body` in a child process; returns whether the child died by a signal or a non-zero exit,
/// and what it wrote to stderr.
template <class F>
std::pair<bool, std::string> dies(F body) {
  int fd[2];
  BOOST_TEST_REQUIRE(::pipe(fd) == 0);
  auto const pid = ::fork();
  BOOST_TEST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fd[1], 2);
    ::close(fd[0]);
    body();
    ::_exit(0);
  }
  ::close(fd[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0), err};
}

volatile std::size_t sink = 0;

} // namespace

// Under PIPESWAP_ASSERTIONS (on with _GLIBCXX_ASSERTIONS, as in CI's sanitizer pass) an index past the
// end aborts and says where; without it the check costs nothing and this case has nothing to show.
BOOST_AUTO_TEST_CASE(an_index_past_the_end_aborts_under_assertions) {
  if constexpr (!PIPESWAP_ASSERTIONS) {
    BOOST_TEST_MESSAGE("PIPESWAP_ASSERTIONS is off in this build: nothing to check");
    return;
  } else {
    lean_vector<std::size_t> v{1, 2, 3};
    auto const [died, err] = dies([&] { sink = v[3]; });
    BOOST_TEST(died);
    BOOST_TEST(err.find("lean_vector::operator[]: index 3 with size 3") != std::string::npos, err);
    auto const [died_empty, err_empty] = dies([] {
      lean_vector<std::string> e;
      e.pop_back();
    });
    BOOST_TEST(died_empty);
    BOOST_TEST(err_empty.find("lean_vector::pop_back") != std::string::npos, err_empty);
    BOOST_TEST(!dies([&] { sink = v[2]; }).first); // the check itself does not fire on a valid index
  }
}

// Under AddressSanitizer the storage between the size and the capacity is poisoned: reading an element
// there through the data pointer, where no bounds check applies, is reported as a container-overflow.
BOOST_AUTO_TEST_CASE(reading_past_the_end_is_a_container_overflow_under_asan) {
#if PIPESWAP_DETAIL_ASAN
  lean_vector<std::size_t> v;
  v.reserve(8);
  v.push_back(1);
  v.push_back(2);
  auto const [died, err] = dies([&] { sink = v.data()[2]; });
  BOOST_TEST(died);
  BOOST_TEST(err.find("container-overflow") != std::string::npos, err);
  BOOST_TEST(!dies([&] { sink = v.data()[1]; }).first);
  v.pop_back(); // shrinking poisons again
  BOOST_TEST(dies([&] { sink = v.data()[1]; }).first);
#else
  BOOST_TEST_MESSAGE("not an AddressSanitizer build: nothing to check");
#endif
}

BOOST_AUTO_TEST_SUITE_END()
