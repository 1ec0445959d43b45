// pitlane console: live regions. A page's live region (the element with data-live, one per page)
// names its stream (server-sent events from /live/…) and the position the page was read at
// (data-live-since). When the stream says "refresh", the region is fetched again from the same
// URL (an htmx request with X-Pitlane-Live: the server answers with the region alone) and
// swapped in place. The server already coalesces bursts to one refresh a second per stream.
//
// When the stream is down (the browser lost it, the server refused it, or the server's
// database listener is reconnecting: event "down"), the region polls every POLL ms instead,
// and stops polling when the stream is back. A refresh answered with an error (or not at all)
// is fetched again POLL ms later, then twice as long after each failure: the stream has moved
// past the change. Nothing is fetched while the tab is hidden (one
// refresh when it shows again), nor while someone is typing into or ticking something in the
// region (one refresh once they leave it); a refresh swapped in keeps the keyboard focus on the
// element it was on (refocus). A region with data-live-poll also polls at that
// interval while visible, whatever the stream says (the locks page: PostgreSQL notifies nothing
// about locks). A region with data-live-due changes by the clock alone that many ms after it was
// read (a payment turning stuck by its age writes nothing, so no stream says so): it is fetched
// once then, and each version of the region says when anew. Without JavaScript the pages are
// plain pages.
//
// A page that updates itself lets its reader stop that (WCAG 2.2.2, as the checkout's "Stop
// updating this page"): a "Pause updates" toggle (aria-pressed) is put before the region; while
// it is pressed nothing is fetched, as while the tab is hidden (the page is behind, and one
// refresh catches it up when it is released).
//
// A refresh that changed something says so in the page's status line (#live-news, role status,
// polite; views/layout.templ), for a screen reader that does not see the table change (WCAG
// 4.1.3): "1 row changed: Payment 1a2b3c4d", "2 rows added, 1 removed", "Status: Completed".
// Nothing is said when a refresh changed nothing, nor while the page is paused (nothing is
// swapped then). The region itself is not a live region: a screen reader would read it all again
// at every refresh.
(function () {
  "use strict";

  var POLL = 2000; // fallback polling while the stream is down
  var DUE_LATE = 1000; // a due refresh comes this much after its time, never before it
  var GRACE = 5000; // the browser's own reconnect gets this long before we poll
  var RETRY_MIN = 5000, RETRY_MAX = 60000; // our reconnects after the browser gave up

  var first = document.querySelector("[data-live]");
  if (!first || !window.EventSource || !window.htmx) {
    return;
  }
  var id = first.id;
  var stream = first.getAttribute("data-live");
  var since = first.getAttribute("data-live-since") || "";
  var slow = parseInt(first.getAttribute("data-live-poll") || "0", 10);

  var source = null;
  var pollTimer = null, graceTimer = null, retryTimer = null, dueTimer = null;
  var retry = RETRY_MIN;
  var stale = false, inflight = false, again = false, failed = false;
  var failTimer = null, failWait = POLL; // the one retry after failed refreshes, backing off
  var paused = false; // the reader pressed "Pause updates"
  var acting = 0; // the user's own requests (a form's post) in flight

  function state(s) {
    document.documentElement.setAttribute("data-live-state", s);
  }

  // behind: the region missed a refresh (the tab hidden, the user busy in it) and will catch up;
  // the page's root says so (data-live-stale) for anyone who looks.
  function behind(v) {
    stale = v;
    if (v) {
      document.documentElement.setAttribute("data-live-stale", "");
    } else {
      document.documentElement.removeAttribute("data-live-stale");
    }
  }

  function region() {
    return document.getElementById(id);
  }

  // busy: the user is in the middle of something inside the region (a focused field, a typed
  // value, a ticked box) that a swap would throw away, or the server sent a form back to be
  // finished (data-live-keep: a refused proposal with what was typed; it is not refreshed
  // until it is sent again or the user leaves the page).
  function busy(el) {
    if (el.querySelector("[data-live-keep]")) {
      return true;
    }
    var a = document.activeElement;
    if (a && el.contains(a) && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName)) {
      return true;
    }
    var fields = el.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "hidden" || f.type === "submit" || f.type === "button") {
        continue;
      }
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) {
          return true;
        }
      } else if (f.tagName === "SELECT") {
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].selected !== f.options[j].defaultSelected) {
            return true;
          }
        }
      } else if (f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function refresh() {
    var el = region();
    if (!el) {
      return;
    }
    if (paused || document.visibilityState === "hidden" || busy(el) || acting > 0) {
      behind(true);
      return;
    }
    if (inflight) {
      again = true;
      return;
    }
    behind(false);
    inflight = true;
    clearTimeout(failTimer); // this fetch is the retry, whatever started it
    failTimer = null;
    var done = function () {
      inflight = false;
      if (failed) {
        // The fetch was answered with an error or not at all (a 503 while the database
        // stalled, a replica going away): the stream has moved past the change it announced,
        // so nothing would announce it again. Fetch again in a while, unless polling will (and
        // a stream that opens again catches up: onopen): one retry at a time, each failure waiting twice as long (up to RETRY_MAX), so an
        // answer that stays an error (a 403 after a role change) is not asked for every POLL
        // ms, nor once more per click while it lasts (the session's own review).
        failed = false;
        again = false;
        behind(true);
        if (!pollTimer) {
          failTimer = setTimeout(function () {
            failTimer = null;
            refresh();
          }, failWait);
          failWait = Math.min(2 * failWait, RETRY_MAX);
        }
        return;
      }
      failWait = POLL;
      if (again) {
        again = false;
        refresh();
      }
    };
    htmx.ajax("GET", window.location.pathname + window.location.search, {
      target: "#" + id,
      swap: "outerHTML",
      headers: { "X-Pitlane-Live": "1" },
    }).then(done, done);
  }

  // due: (re)arms the one refresh the region's data-live-due asks for (none without it); called
  // once the page is loaded and after every swap, which may bring a new region.
  function due() {
    clearTimeout(dueTimer);
    dueTimer = null;
    var el = region();
    var ms = el ? parseInt(el.getAttribute("data-live-due") || "", 10) : NaN;
    if (ms >= 0) {
      // setTimeout takes at most 2^31-1 ms (24.8 days); a longer wait is cut short, harmlessly.
      dueTimer = setTimeout(function () {
        dueTimer = null;
        refresh();
      }, Math.min(ms + DUE_LATE, 2147483647));
    }
  }

  function startPolling() {
    state("polling");
    if (!pollTimer) {
      pollTimer = setInterval(function () {
        if (document.visibilityState === "visible") {
          refresh();
        }
      }, POLL);
    }
  }

  function stopPolling() {
    clearInterval(pollTimer);
    pollTimer = null;
  }

  function connect() {
    retryTimer = null;
    var url = stream + (stream.indexOf("?") < 0 ? "?" : "&") + "since=" + encodeURIComponent(since);
    source = new EventSource(url);
    source.onopen = function () {
      clearTimeout(graceTimer);
      graceTimer = null;
      retry = RETRY_MIN;
      stopPolling();
      state("live");
      // Behind (a failed refresh, its polls failing too): the stream starts past the change it
      // missed, so nothing would announce it again (the session's own review).
      if (stale) {
        refresh();
      }
    };
    source.addEventListener("refresh", function (e) {
      if (e.lastEventId) {
        since = e.lastEventId;
      }
      stopPolling();
      state("live");
      refresh();
    });
    source.addEventListener("down", function () {
      startPolling();
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        // Refused (signed out, wrong role, shutting down, live updates off): poll, and try a
        // new stream later.
        source = null;
        startPolling();
        if (!retryTimer) {
          retryTimer = setTimeout(connect, retry);
          retry = Math.min(2 * retry, RETRY_MAX);
        }
        return;
      }
      // The browser reconnects by itself (and sends its last event id): poll only if that
      // takes long.
      if (!graceTimer && !pollTimer) {
        graceTimer = setTimeout(function () {
          graceTimer = null;
          if (!source || source.readyState !== EventSource.OPEN) {
            startPolling();
          }
        }, GRACE);
      }
    };
  }

  var keyAttrs = ["data-testid", "name", "href", "aria-label"];

  // focusKey is what tells the element with the keyboard focus inside the region apart, to find
  // it again in the region a refresh swaps in (null when the focus is not inside it): its id,
  // data-testid, name, href and aria-label (a scrolling table's region), its text, and the
  // nearest element around it inside the region with an id or a data-id (its table row).
  function focusKey(el) {
    var a = document.activeElement;
    if (!a || a === el || !el.contains(a)) {
      return null;
    }
    var key = { tag: a.tagName, id: a.id, text: a.textContent.trim(), scope: null };
    keyAttrs.forEach(function (n) {
      key[n] = a.getAttribute(n);
    });
    var around = a.parentElement && a.parentElement.closest("[id], [data-id]");
    if (around && around !== el && el.contains(around)) {
      key.scope = around.id ? "#" + CSS.escape(around.id) : '[data-id="' + CSS.escape(around.getAttribute("data-id")) + '"]';
    }
    return key;
  }

  // refocus gives the keyboard focus back to the element of the new region that matches key,
  // when the swap threw it to the page's body (the old element is gone): a screen reader lost
  // its place and the next Tab started at the top of the page, every 10 s on the locks page (an
  // outside review). htmx itself keeps the focus of an element with an id; one without is
  // looked for inside the element with the id it was in (its row), matched by its attributes,
  // and by its text when they do not tell it apart (a Check button whose label changed is still
  // the Check button). Nothing moves unless exactly one element matches: two rows' "Approve:
  // mark Failed" buttons are alike, and the first of them took the focus of the second, whose
  // Enter then approved the other proposal (a review of the change). Nor when the focus is
  // anywhere else. preventScroll: the page stays where it was.
  function refocus(key) {
    var a = document.activeElement;
    var el = region();
    if (!key || !el || (a && a !== document.body)) {
      return;
    }
    var found = null;
    if (key.id) {
      found = document.getElementById(key.id);
    } else {
      var root = el;
      if (key.scope) {
        root = el.querySelector(key.scope);
        if (!root) {
          return; // its row is gone
        }
      }
      var same = [];
      root.querySelectorAll(key.tag).forEach(function (c) {
        if (keyAttrs.every(function (n) { return c.getAttribute(n) === key[n]; })) {
          same.push(c);
        }
      });
      var named = keyAttrs.some(function (n) { return key[n] !== null; });
      var texts = same.filter(function (c) { return c.textContent.trim() === key.text; });
      if (named && same.length === 1) {
        found = same[0];
      } else if (texts.length === 1) {
        found = texts[0];
      }
    }
    if (found && el.contains(found)) {
      found.focus({ preventScroll: true });
    }
  }

  // scrolled is how far each of the region's scrolling tables is scrolled sideways, by its
  // region's aria-label (unique on a page); keepScrolled scrolls the new region's tables there:
  // at 320 CSS px a table read sideways jumped back to its first column at every refresh (a
  // review of the change that wrapped the tables).
  function scrolled(el) {
    var at = {};
    el.querySelectorAll(".table-scroll[aria-label]").forEach(function (t) {
      if (t.scrollLeft) {
        at[t.getAttribute("aria-label")] = t.scrollLeft;
      }
    });
    return at;
  }
  function keepScrolled(at) {
    var el = region();
    if (!el || !at) {
      return;
    }
    el.querySelectorAll(".table-scroll[aria-label]").forEach(function (t) {
      var x = at[t.getAttribute("aria-label")];
      if (x) {
        t.scrollLeft = x;
      }
    });
  }

  // rows is what a refresh may change in the region, by a key that finds it again in the next
  // version: each table body row, by its table (data-testid) and its id, data-id or name (a
  // repeated key counts up: two locks of one backend), and each element marked data-live-item
  // (a figure with its name: the payment's Status). What a row says is its text without the
  // parts marked data-live-quiet (a "3m ago" changes by the clock alone, every 10 s on the
  // locks page: it is no news).
  function rows(el) {
    var out = {};
    el.querySelectorAll("tr, [data-live-item]").forEach(function (r) {
      var item = r.getAttribute("data-live-item");
      var key, name;
      if (item !== null) {
        key = "item " + item;
        name = item;
      } else {
        if (!r.querySelector("td") || r.closest("thead")) {
          return; // a header row
        }
        var table = r.closest("table");
        name = rowName(r, table);
        key = "row " + (table && table.getAttribute("data-testid") || "") + " " + (r.id || r.getAttribute("data-id") || name);
      }
      var k = key;
      for (var i = 2; Object.prototype.hasOwnProperty.call(out, k); i++) {
        k = key + " #" + i;
      }
      out[k] = { item: item !== null, name: name, text: saying(r) };
    });
    return out;
  }

  function words(s) {
    return s.replace(/\s+/g, " ").trim();
  }

  function saying(e) {
    if (!e.querySelector("[data-live-quiet]")) {
      return words(e.textContent);
    }
    var c = e.cloneNode(true);
    c.querySelectorAll("[data-live-quiet]").forEach(function (q) {
      q.remove();
    });
    return words(c.textContent);
  }

  // rowName names a row as a reader would: its first cell that says something, after its
  // column's heading ("Payment 1a2b3c4d", "# 12" reads "#12").
  function rowName(r, table) {
    var cells = r.cells;
    for (var i = 0; i < cells.length; i++) {
      var text = words(cells[i].textContent);
      if (!text) {
        continue; // a tick box
      }
      var head = table && table.tHead && table.tHead.rows[0] && table.tHead.rows[0].cells[i];
      var h = head ? words(head.textContent) : "";
      if (h === "#") {
        return "#" + text.replace(/^#/, "");
      }
      if (!h || h === "Actions" || text.indexOf(h) === 0) {
        return text.slice(0, 80);
      }
      return (h + " " + text).slice(0, 80);
    }
    return "";
  }

  // news says what changed from one version of the region to the next ("" for nothing).
  function news(before, after) {
    var changed = [], added = [], removed = [], figures = [];
    Object.keys(after).forEach(function (k) {
      var a = after[k], b = before[k];
      if (!b) {
        if (!a.item) {
          added.push(a);
        }
      } else if (b.text !== a.text) {
        (a.item ? figures : changed).push(a);
      }
    });
    Object.keys(before).forEach(function (k) {
      if (!after[k] && !before[k].item) {
        removed.push(before[k]);
      }
    });
    var parts = [];
    if (figures.length > 3) {
      parts.push(figures.length + " figures changed");
    } else {
      figures.forEach(function (f) {
        parts.push(f.name + ": " + f.text);
      });
    }
    var kinds = [[changed, "changed"], [added, "added"], [removed, "removed"]].filter(function (k) {
      return k[0].length > 0;
    });
    if (kinds.length === 1 && kinds[0][0].length === 1) {
      var one = kinds[0][0][0];
      parts.push("1 row " + kinds[0][1] + (one.name ? ": " + one.name : ""));
    } else if (kinds.length > 0) {
      parts.push(kinds.map(function (k, i) {
        var n = k[0].length;
        return n + (i === 0 ? (n === 1 ? " row " : " rows ") : " ") + k[1];
      }).join(", "));
    }
    return parts.join("; ");
  }

  // say puts the news in the page's status line. The same words again are taken away first and
  // put back a moment later: a screen reader hears a change of the text, not the same text set.
  var sayTimer = null;
  function say(msg) {
    var out = document.getElementById("live-news");
    if (!out || !msg) {
      return;
    }
    clearTimeout(sayTimer);
    if (out.textContent !== msg) {
      out.textContent = msg;
      return;
    }
    out.textContent = "";
    sayTimer = setTimeout(function () {
      out.textContent = msg;
    }, 150);
  }

  // A refresh fetched before someone started typing must not land after it: its answer is
  // checked again when it arrives, and not swapped in (one refresh once they leave) while the
  // region is busy. Only the live refresh's own answers (X-Pitlane-Live) are held back: a form
  // the user submits swaps its answer in as always. An answer swapped in keeps the keyboard
  // focus where it was (refocus): where it is when the answer lands, not when it was asked for.
  var focusBefore = null, scrolledBefore = null, rowsBefore = null;
  function liveRequest(e) {
    var cfg = e.detail.requestConfig;
    return !!(cfg && cfg.headers && cfg.headers["X-Pitlane-Live"] === "1");
  }
  // A live refresh neither starts nor lands while one of the user's own requests (a form's
  // post) is under way: its swap replaced the block the post's answer was bound for, and that
  // answer went into the old block, off the page — after "Request cancel" the page showed the
  // refresh's view, asked for without ?challenge=, with no code form and nothing said (a CI
  // run). The refresh comes after the user's answer. Counted to the request's own end
  // (loadend): htmx's events about a form whose block was taken off the page no longer reach
  // the document.
  document.addEventListener("htmx:beforeSend", function (e) {
    var xhr = e.detail.xhr;
    if (liveRequest(e) || !xhr) {
      return;
    }
    acting++;
    xhr.addEventListener("loadend", function () {
      acting--;
      if (stale && acting === 0) {
        setTimeout(refresh, 0);
      }
    });
  });
  document.addEventListener("htmx:beforeSwap", function (e) {
    var el = region();
    if (!el || !liveRequest(e)) {
      return;
    }
    if (acting > 0) {
      e.detail.shouldSwap = false;
      behind(true); // asked again when the user's request ends
      return;
    }
    if (paused || busy(el)) {
      e.detail.shouldSwap = false;
      behind(true);
      return;
    }
    focusBefore = focusKey(el);
    scrolledBefore = scrolled(el);
    rowsBefore = rows(el);
  });
  document.addEventListener("htmx:afterSwap", function (e) {
    if (liveRequest(e)) {
      refocus(focusBefore);
      keepScrolled(scrolledBefore);
      var el = region();
      if (el && rowsBefore) {
        say(news(rowsBefore, rows(el)));
      }
      focusBefore = scrolledBefore = rowsBefore = null;
    }
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    var cfg = e.detail.requestConfig;
    if (cfg && cfg.headers && cfg.headers["X-Pitlane-Live"] === "1" && e.detail.successful !== true) {
      failed = true;
    }
  });
  document.addEventListener("htmx:afterSettle", due);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible" && stale) {
      refresh();
    }
  });
  // Leaving a field, submitting or resetting a form may end "busy": catch up then.
  ["focusout", "change", "reset"].forEach(function (type) {
    document.addEventListener(type, function () {
      if (stale) {
        setTimeout(refresh, 0);
      }
    });
  });
  if (slow > 0) {
    setInterval(function () {
      if (document.visibilityState === "visible") {
        refresh();
      }
    }, slow);
  }
  // Leaving the page closes its stream. A page the browser kept (the back/forward cache) and
  // shows again opens a new one and catches up: its region is as old as when it was left, and
  // the stream closed then would never say what changed since.
  window.addEventListener("pagehide", function () {
    if (source) {
      source.close();
      source = null;
    }
    clearTimeout(graceTimer);
    graceTimer = null;
    clearTimeout(retryTimer);
    retryTimer = null;
  });
  window.addEventListener("pageshow", function (e) {
    if (!e.persisted) {
      return;
    }
    state("connecting");
    if (!source) {
      connect();
    }
    refresh();
  });
  // pauseControl puts the "Pause updates" toggle before the region (outside it: a swap does not
  // take it away) and a status line that says when the page is paused. The button's name stays
  // the same, its state is aria-pressed (a toggle whose label changed too would be read as
  // "Resume updates, pressed").
  function pauseControl() {
    var bar = document.createElement("div");
    bar.className = "live-controls";
    var button = document.createElement("button");
    button.type = "button";
    button.setAttribute("aria-pressed", "false");
    button.setAttribute("data-testid", "live-pause");
    button.textContent = "Pause updates";
    var note = document.createElement("span");
    note.className = "muted small";
    note.setAttribute("role", "status");
    note.setAttribute("data-testid", "live-paused");
    bar.appendChild(button);
    bar.appendChild(note);
    first.parentNode.insertBefore(bar, first);
    button.addEventListener("click", function () {
      paused = !paused;
      button.setAttribute("aria-pressed", paused ? "true" : "false");
      note.textContent = paused ? "Updates paused: this page shows what it showed then, until you press again." : "";
      if (paused) {
        document.documentElement.setAttribute("data-live-paused", "");
      } else {
        document.documentElement.removeAttribute("data-live-paused");
        if (stale) {
          refresh();
        }
      }
    });
  }

  pauseControl();
  state("connecting");
  due();
  connect();
})();
