// Keeps a dashboard page live: every data-refresh-ms it fetches the same URL again and swaps in
// each section marked data-live (matched by id); between fetches it ages the heartbeat ages.
(function () {
  "use strict";
  const body = document.body;
  const every = Number(body.dataset.refreshMs || 2000);
  const indicator = document.getElementById("live");
  let fetchedAt = Date.now();
  let busy = false;

  function fmtAge(ms) {
    if (ms < 10000) return (ms / 1000).toFixed(1) + "s";
    if (ms < 3600000) return Math.floor(ms / 60000) + "m" + String(Math.floor(ms / 1000) % 60).padStart(2, "0") + "s";
    return Math.floor(ms / 3600000) + "h" + String(Math.floor(ms / 60000) % 60).padStart(2, "0") + "m";
  }

  function tickAges() {
    const since = Date.now() - fetchedAt;
    document.querySelectorAll("[data-age-ms]").forEach(function (el) {
      if (el.dataset.ageMs === "") return;
      el.textContent = fmtAge(Number(el.dataset.ageMs) + since);
    });
  }

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      document.querySelectorAll("[data-live]").forEach(function (section) {
        const fresh = doc.getElementById(section.id);
        if (fresh && fresh.innerHTML !== section.innerHTML) section.innerHTML = fresh.innerHTML;
      });
      fetchedAt = Date.now();
      body.dataset.updated = String(fetchedAt);
      if (indicator) { indicator.textContent = "live"; indicator.classList.remove("stale"); }
    } catch (error) {
      if (indicator) { indicator.textContent = "offline: " + error.message; indicator.classList.add("stale"); }
    } finally {
      busy = false;
    }
  }

  if (document.querySelector("[data-live]")) {
    setInterval(refresh, every);
    setInterval(tickAges, 250);
  }
})();
